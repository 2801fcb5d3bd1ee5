"""A LangGraph agent with two tools, trained with GRPO on the tiny preset (see agent.py)."""
