"""One RL step on a preset (tiny or smollm2-135m): `LocalBackend` + `TrainableModel` against TRL's `GRPOTrainer`.

What it measures, on the tiny preset (CPU, float32, LoRA r=8 alpha=16 on all
attention and MLP projections, the same prompts and reward for both sides):

1. `rl_step`: seconds per full GRPO step. Ours: P prompts × G concurrent chat requests
   through the OpenAI-compatible server (C completion tokens each, `ignore_eos`), the
   trajectories recorded with `LLMCall.from_openai` (token ids and their logprobs as
   plain lists, `return_token_logprobs`, what `capture()` asks for), then `model.train` (checks,
   advantages, trajectories JSONL, token-exact tensorization, one optimizer step,
   checkpoint on disk, adapter swapped into the engine); the wall time of all of it.
   TRL: `GRPOTrainer` (transformers `generate`, `use_vllm=False`) with `num_generations=G`,
   `max_completion_length=C`, `min_new_tokens=C` (so lengths match), one optimizer step
   per P × G completions (`per_device_train_batch_size=P*G`, no accumulation), `beta=0`,
   no gradient checkpointing, plain temperature-1 sampling (`top_k=0`, `top_p=1`, no
   `min_p`), no logging or saving; seconds from its `on_step_begin` to its `on_step_end`
   callback (generation happens in between), and of its `generate` call alone.
   TRL runs in a child process (`--only trl --lockstep`) so each side's peak RSS is its
   own; it waits for the parent's go before each step, so the two alternate (one TRL
   step, then one of ours per variant) and the noise of a shared machine falls on both,
   while neither runs when the other is timed. Both run `--warmup` untimed steps, then
   `--steps` timed ones; the table reports medians, the ratio ours / TRL of the medians
   (target ≤ 0.8) and of the fastest steps (the least disturbed), with each side's
   generation share. Ours alternates the default `TrainConfig()` (sequences packed, a
   group's common prompt run once: `share_prefixes`) with two diagnostic rows on the
   same model: `share_prefixes=False` (each sequence's prompt computed again, as TRL
   does) and `pack_sequences=False`.
2. `packing`: trainer tokens/s (`metrics['train_tokens_per_s']`, real tokens over the
   step's seconds) of one `LoRATrainer.rl_step` on the same `--pack-seqs` constructed
   sequences (lengths drawn uniformly in 20..400, a third of each a masked prompt) with
   `TrainConfig(pack_sequences=True)` and `pack_sequences=False` (one padded row per
   sequence), alternated, median of `--pack-repeats`; with the micro-batch shapes the
   trainer really built (recorded by wrapping its `micro_batches`, whatever rule picks
   the row length) and `metrics['padding_waste']`.
3. `swap`: from `model.train()` returning to the first request for `m` (max_tokens=1)
   completing, whose `model` must be `m@{new step}`; over every step of part 1 plus
   `--swap-steps` more (each trains one group again). A second identical request right
   after gives the steady-state latency of such a request. Also `metrics['swap_seconds']`
   (the adapter load inside `train`).
4. Peak RSS (`ru_maxrss`) of our process after `register`, after part 1 and at the end
   (parts 2 and 3 add a second trainer); of TRL's child after its imports and at the end.

Left out: GPUs, vLLM, KL to a reference model (`beta=0` on both sides), multi-turn and
tool rollouts, several optimizer steps per batch, TRL's own reward-model and logging
paths, and learning quality (the tiny model is random). Ours includes what TRL does not
do (an HTTP round trip per completion, trajectory records, a checkpoint on disk each
step); TRL includes what ours skips (nothing here: zero-variance groups are counted
below, and there are none with this reward). The machine is shared: read the ratios.

Run (from the repository root):

    .venv/bin/python -m bench.rl_step [--prompts 4 --group-size 8 --completion-tokens 32 --steps 5]

`--only ours` runs part 1 for our side alone and prints its steps (nothing saved), e.g.
under `.venv/bin/py-spy record -o out.txt -f raw -- .venv/bin/python -m bench.rl_step
--only ours`.
"""

from bench.rl_step.cli import main

__all__ = ["main"]
