"""Chat formatting: OpenAI-format messages and tools to prompt token ids with a model's chat
template (`templates.py`: the template, the generic tool format for templates that ignore
tools), and completion text back to tool calls (`format.py`).

Shared by the server (which renders requests and parses completions), the trainer and SFT
(which render trajectories and find the assistant's tokens) and the engines (which load a
user's template). The engine itself speaks token ids only. Left out: tokenizers (the
model's own, from transformers) and the HTTP protocol (`serving/`).
"""
