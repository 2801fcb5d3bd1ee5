"""GRPO on BFCL through the LangGraph swap-in (see app.py)."""

from examples.bfcl.app import main

main()
