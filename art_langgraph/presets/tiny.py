"""The tiny offline model kit: a small Qwen2-architecture causal LM built with no network.

`build_tiny(cache_dir)` returns a folder holding a randomly initialised (seeded,
deterministic) `Qwen2ForCausalLM` and a byte-level BPE tokenizer trained offline with
`tokenizers` on a synthetic corpus, with a Qwen2.5-style chat template that renders
tools and `<tool_call>{json}</tool_call>` calls and marks assistant turns with
`{% generation %}` (so `return_assistant_tokens_mask=True` works). The folder loads
with the ordinary `AutoModelForCausalLM` / `AutoTokenizer` code.

It is cached on disk under a versioned key (`tiny-v{VERSION}`): bump `VERSION` when
anything that changes the weights or the tokenizer changes. The folder is written
atomically (built in a temp dir, then renamed), so a crash mid-build leaves nothing
half-written.

Left out: any claim that the model knows anything. It is for tests, the CPU
development path and benchmarks; it learns formats only through training.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from art_langgraph.presets.cache import cached_folder

VERSION = 4
TINY_PRESET = "tiny"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Special tokens: skipped when decoding with skip_special_tokens."""
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
"""Single tokens that decode as text (as in Qwen2.5)."""


@dataclass(frozen=True)
class TinySpec:
    """Shape of the tiny model; the defaults are the `tiny` preset."""

    vocab_size: int = 2000
    """BPE vocabulary size, special and added tokens included."""
    hidden_size: int = 128
    """Width of the residual stream."""
    intermediate_size: int = 384
    """Width of the MLP."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 4
    """Query heads (head dim = hidden_size / num_attention_heads)."""
    num_key_value_heads: int = 2
    """Key/value heads (grouped-query attention, as in Qwen2)."""
    max_position_embeddings: int = 4096
    """Context length in tokens."""
    seed: int = 0
    """Seed for the weights and the tokenizer corpus."""
    output_scale: float = 6.0
    """Initial weight of the final RMSNorm. With the usual 1.0, a random model's logits have a
    std of ~0.2 and, since that norm caps the hidden state, no LoRA update can sharpen them:
    the model could never learn to emit a format. 6.0 gives logits a std of ~1.4 (entropy
    still near uniform) and room to learn."""


_WORDS = (
    "the a an of to in and or is are was be not for on with as at by from it this that "
    "you we they he she i me my your our their what which who when where why how "
    "can could should would will do does did have has had get got make made find found "
    "use used call called return returned answer question task tool tools result results "
    "weather city temperature time date today tomorrow add sum multiply number numbers "
    "search query file files read write list item items name value values true false null "
    "user assistant system function arguments error ok done please thanks hello world "
    "one two three four five six seven eight nine ten zero first last next previous "
    "email inbox message send reply subject from to cc date calendar event meeting "
    "yes no maybe more less than then else if for each all any some none every"
).split()

_KEYS = ["name", "arguments", "city", "a", "b", "query", "x", "y", "path", "text", "task", "id"]


def _corpus(seed: int, n_lines: int = 6000) -> list[str]:
    """Deterministic synthetic text: prose, numbers, JSON and chat markup."""
    rng = random.Random(seed)
    lines: list[str] = []
    for i in range(n_lines):
        kind = i % 4
        if kind == 0:
            n = rng.randint(3, 14)
            s = " ".join(rng.choice(_WORDS) for _ in range(n))
            lines.append(s.capitalize() + rng.choice([".", "?", "!", ":"]))
        elif kind == 1:
            args = {rng.choice(_KEYS): rng.choice([rng.randint(0, 999), rng.choice(_WORDS)])}
            call = {"name": rng.choice(_WORDS) + "_" + rng.choice(_WORDS), "arguments": args}
            lines.append("<tool_call>\n" + json.dumps(call) + "\n</tool_call>")
        elif kind == 2:
            schema = {
                "type": "function",
                "function": {
                    "name": rng.choice(_WORDS),
                    "description": " ".join(rng.choice(_WORDS) for _ in range(6)),
                    "parameters": {
                        "type": "object",
                        "properties": {rng.choice(_KEYS): {"type": "string"}},
                        "required": [],
                    },
                },
            }
            lines.append(json.dumps(schema))
        else:
            role = rng.choice(["system", "user", "assistant"])
            text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 10)))
            lines.append(f"<|im_start|>{role}\n{text} {rng.randint(0, 10**6)}<|im_end|>")
    return lines


def _train_tokenizer(spec: TinySpec):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS + ADDED_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    template = (Path(__file__).parent / "chat_template.jinja").read_text()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=spec.max_position_embeddings,
    )
    # Tool markup decodes as text, like Qwen2.5's added tokens.
    hf.add_tokens(ADDED_TOKENS, special_tokens=False)
    hf.chat_template = template
    return hf


def _build(folder: Path, spec: TinySpec) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = _train_tokenizer(spec)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            model.model.norm.weight.fill_(spec.output_scale)
    model.generation_config = GenerationConfig(
        eos_token_id=[config.eos_token_id, config.pad_token_id],
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "art_preset.json").write_text(
        json.dumps({"preset": TINY_PRESET, "version": VERSION, "spec": asdict(spec)}, indent=2)
    )


def build_tiny(cache_dir: Path | None = None, spec: TinySpec | None = None) -> Path:
    """Build (or reuse from the cache) the tiny preset and return its folder."""
    spec = spec or TinySpec()
    key = f"tiny-v{VERSION}" if spec == TinySpec() else f"tiny-v{VERSION}-{_spec_key(spec)}"
    return cached_folder(key, lambda tmp: _build(tmp, spec), cache_dir)


def _spec_key(spec: TinySpec) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:10]
