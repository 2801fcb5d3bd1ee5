"""Optional integrations: each module needs its extra (`langfuse`, `wandb`)."""

__all__: list[str] = []
