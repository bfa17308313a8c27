"""A run names the code it ran: the commit and dirty flag, and the tree of the files as they stood, which matches the
commit holding exactly those files even when the checkout's .git lags them (the device machines' copies)."""
import json
import subprocess

from reward_density.experiment.provenance import device_description, git_state, working_tree, write_json_atomic


def git(repo, *args: str) -> str:
    command = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *args]
    return subprocess.run(command, cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def a_repository(tmp_path):
    """A repository of one commit: a tracked file and a .gitignore that ignores *.log."""
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / ".gitignore").write_text("*.log\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


def stored_objects(repo) -> set[str]:
    """Every file of the repository's object store (loose objects and packs)."""
    return {str(path.relative_to(repo)) for path in (repo / ".git" / "objects").rglob("*") if path.is_file()}


def test_a_clean_checkouts_tree_is_its_commits_tree(tmp_path):
    repo = a_repository(tmp_path)
    assert git_state(repo) == {"commit": git(repo, "rev-parse", "HEAD"), "dirty": False}
    assert working_tree(repo) == git(repo, "rev-parse", "HEAD^{tree}")


def test_files_ahead_of_the_commit_are_named_by_the_commit_that_later_holds_them(tmp_path):
    repo = a_repository(tmp_path)
    (repo / "code.py").write_text("x = 2\n")
    (repo / "new.py").write_text("y = 1\n")  # untracked, as new files are in a copy whose .git is older
    (repo / "run.log").write_text("ignored\n")
    status, objects = git(repo, "status", "--porcelain"), stored_objects(repo)
    recorded = working_tree(repo)
    assert git_state(repo)["dirty"] is True
    assert recorded != git(repo, "rev-parse", "HEAD^{tree}"), "the tree must see the edited and the new file"
    assert git(repo, "status", "--porcelain") == status, "recording the tree must not stage anything"
    assert stored_objects(repo) == objects, "recording the tree must not write into the checkout's object store"
    git(repo, "add", "code.py", "new.py")
    git(repo, "commit", "-q", "-m", "second")
    assert git(repo, "rev-parse", "HEAD^{tree}") == recorded, "the commit holding those files must have the tree"


def test_code_unpacked_inside_another_repository_records_no_commit(tmp_path):
    outer = a_repository(tmp_path)
    project = outer / "downloads" / "project"  # a zip of the code, unpacked in a home folder kept under git
    project.mkdir(parents=True)
    assert git_state(project)["commit"] == git(outer, "rev-parse", "HEAD"), "git answers for the enclosing repository"
    assert git_state(project, root=project) == {"commit": None, "dirty": None}
    assert git_state(outer, root=outer)["commit"] == git(outer, "rev-parse", "HEAD")


def test_results_a_run_rewrote_do_not_make_its_code_dirty(tmp_path):
    repo = a_repository(tmp_path)
    (repo / "outputs").mkdir()
    (repo / "outputs" / "report.md").write_text("committed\n")
    git(repo, "add", "outputs")
    git(repo, "commit", "-q", "-m", "results")
    (repo / "outputs" / "report.md").write_text("rewritten by a run on another CPU\n")
    assert git_state(repo / "outputs")["dirty"] is False, "only the code decides the dirty flag"
    (repo / "code.py").write_text("x = 2\n")
    assert git_state(repo / "outputs")["dirty"] is True


def test_a_new_file_git_does_not_ignore_makes_the_code_dirty_and_a_new_result_or_ignored_file_does_not(tmp_path):
    repo = a_repository(tmp_path)
    (repo / "outputs").mkdir()
    (repo / "outputs" / "report.md").write_text("a run's new result\n")
    (repo / "run.log").write_text("ignored\n")
    assert git_state(repo)["dirty"] is False
    (repo / "params").mkdir()
    (repo / "params" / "new.yaml").write_text("profile: new\n")  # a profile, or code, not yet added
    assert git_state(repo)["dirty"] is True


def test_outside_a_checkout_there_is_no_commit_and_no_tree(tmp_path):
    assert git_state(tmp_path) == {"commit": None, "dirty": None}
    assert working_tree(tmp_path) is None


def test_a_cell_and_a_run_record_the_code_they_started_with_not_a_commit_made_while_they_ran(tmp_path, monkeypatch):
    from reward_density.experiment import cell, provenance
    from reward_density.experiment.profiles import REPO_ROOT, cell_config, load_profile
    from reward_density.run import stage_times

    checkout = {"commit": "started", "dirty": False}
    monkeypatch.setattr(provenance, "git_state", lambda cwd=None, root=None: dict(checkout))
    config = cell_config(load_profile(REPO_ROOT / "params" / "smoke.yaml"), "outcome", 1, 0,
                         out_dir=str(tmp_path / "cell"), report_to="none")
    writer, times = cell.CellWriter(config), stage_times.StageTimes()
    checkout["commit"] = "committed-while-running"
    writer.add_eval(0, [{"problem_id": "p", "correct": 0, "length": 1, "truncated": 0, "answered": 1}])
    writer.finish("cpu")
    times.append_to(tmp_path / "runs.jsonl")
    assert provenance.read_json(tmp_path / "cell" / "manifest.json")["git"]["commit"] == "started"
    assert json.loads((tmp_path / "runs.jsonl").read_text())["git"]["commit"] == "started"


def test_a_json_result_gets_the_umasks_permissions_like_any_other_file(tmp_path):
    write_json_atomic(tmp_path / "summary.json", {"pass1": 0.5})
    (tmp_path / "history.csv").write_text("step\n")
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == (tmp_path / "history.csv").stat().st_mode & 0o777
    assert sorted(path.name for path in tmp_path.iterdir()) == ["history.csv", "summary.json"]


def test_an_mps_device_is_named_as_the_gpu_not_as_the_cpus_threads():
    assert device_description("mps").startswith("Apple GPU (mps)")
    assert "torch thread" in device_description("cpu")
