"""`python -m reward_density.run`: the study's command line (cli.py)."""
import sys

try:
    from .cli import main
except KeyboardInterrupt:  # Ctrl-C during the imports (seconds): nothing has started, so nothing to resume
    print("interrupted before the run started", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
