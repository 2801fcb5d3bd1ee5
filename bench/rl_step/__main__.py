"""`python -m bench.rl_step`."""

from bench.rl_step.cli import main

main()
