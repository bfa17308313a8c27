"""`python -m reward_density.run`: the study's command line (cli.py)."""
import sys

from .cli import main

sys.exit(main())
