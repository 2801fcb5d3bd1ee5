"""The torch engine's LoRA adapter slots: adapters loaded, replaced and freed under peft keys.

`AdapterSlots` owns the engine's model while adapters come and go: the plain base model
until the first load, then a peft `PeftModel` over it holding each adapter under a key of
its own (`a1`, `a2`, ...; `adapters` maps the user's names onto them). A load checks the
adapter against the base model before touching it (`_check_adapter_fits`), then either
writes its tensors in place into the *spare* key (a key freed earlier and kept for this:
a new key costs peft a new module per target layer, about 0.35 s on SmolLM2) or creates
a new key. With `merge_latest`, the newest adapter is also merged into a second copy of
the weights (`merged`, served for batches of that adapter alone); on the CPU with packed
weights that copy is a module tree over the base's tensors whose targeted layers multiply
by packed merged weights (`_merge_packed`). An adapter replaced or unloaded is *retired*:
its key is deleted, or kept as the spare, once no running row uses it (`free_retired`).

Every key carries a weights identity, the prefix cache's key (`engine/prefix_cache.py`),
renewed at each load, so no KV computed under earlier weights is ever served.

Only the engine's worker thread calls the methods, between two steps, so a load never
races a forward pass; other threads only read `adapters`.

Left out: the request queue and the threading (`torch_engine.py`: `load_adapter` and
`unload_adapter` post commands that run `load` and `unload` on the worker), the forward
itself (`TorchEngine._forward`, which asks `route` which weights a batch runs), and the
frozen weights shared with a trainer (`shared_base.py`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from art_langgraph.engine.packed_linear import PackedLinear, can_pack, pack_linears, packed_weight
from art_langgraph.errors import UsageError

if TYPE_CHECKING:
    from art_langgraph.engine.prefix_cache import PrefixCache
    from art_langgraph.engine.shared_base import SharedBase

BASE_KEY = "__base__"
"""peft's name for "no adapter" in a mixed batch: the key of rows that use the base model."""


class AdapterSlots:
    """The engine's model and its LoRA adapters under peft keys (see the module's docstring)."""

    def __init__(
        self,
        model: Any,
        *,
        shared_base: SharedBase,
        prefix: PrefixCache,
        in_use: Callable[[], set[str]],
        merge_latest: bool,
        prepack_weights: bool,
    ) -> None:
        """`model`: the base model, as the engine loaded it. `shared_base`: its frozen
        weights. `prefix`: the engine's prefix cache, told of every identity retired.
        `in_use`: the keys the running rows use now. `merge_latest` and `prepack_weights`:
        the `TorchEngineConfig` settings."""
        # peft is imported here, on the thread that builds the engine, not first by the worker
        # in `load`: a first import of it there while the caller's thread imported other parts
        # of torch could meet half-made modules (as llguidance.torch did: `GrammarCompiler`).
        import peft  # noqa: F401

        self.base_model: Any = model
        """The plain model (peft's base model once an adapter is loaded)."""
        self.model: Any = model
        """The model batches run: `base_model`, or a `PeftModel` over it while adapters are loaded."""
        self.adapters: dict[str, str] = {}
        """User name -> peft key."""
        self.retired: set[str] = set()
        """peft keys to delete once no running row uses them."""
        self.spare: str | None = None
        """One unused peft key, kept to load the next adapter into (`_load_into_spare`)."""
        self.merged: Any = None
        """A plain model with one adapter merged in (`merge_latest`), or None."""
        self.merged_key: str | None = None
        """The peft key of the adapter merged into `merged`."""
        self._shared_base = shared_base
        self._prefix = prefix
        self._in_use = in_use
        self._merge_latest = merge_latest
        self._prepack_weights = prepack_weights
        self._keys = itertools.count(1)
        self._identity: dict[str, str] = {BASE_KEY: BASE_KEY}  # peft key -> weights identity
        self._loads = itertools.count(1)

    def identity(self, key: str) -> str:
        """The weights identity of peft key `key` (the prefix cache's key). A key retired
        while its request queued has none: a fresh one, that shares nothing."""
        return self._identity.get(key) or f"orphan.{next(self._loads)}"

    def route(self, keys: list[str]) -> tuple[Any, Any, dict[str, Any]]:
        """Which weights serve a batch whose rows use the peft `keys`: (the module to call,
        a context to call it in, its extra keywords). The merged copy for a batch of the
        latest adapter alone, the base with adapters off for base rows alone, one adapter
        set active for a batch of one, else peft's mixed batch (`adapter_names`)."""
        model, unique = self.model, set(keys)
        if model is self.base_model:
            return model, contextlib.nullcontext(), {}
        if self.merged_key is not None and unique == {self.merged_key}:
            return self.merged, contextlib.nullcontext(), {}
        if unique == {BASE_KEY}:
            return model, model.disable_adapter(), {}
        if len(unique) == 1:
            # One adapter for the whole batch: peft's plain path is ~1.7x faster than its
            # mixed-batch path (measured on the tiny preset, 32 rows).
            (key,) = unique
            if model.active_adapter != key:
                model.set_adapter(key)
            return model, contextlib.nullcontext(), {}
        return model, contextlib.nullcontext(), {"adapter_names": keys}

    def load(self, name: str, path: str) -> None:
        """Load the peft adapter folder `path` as adapter `name`, replacing any of that name."""
        from peft import PeftModel

        tensors = _check_adapter_fits(self.base_model, name, path)
        key = self._load_into_spare(path, tensors) if tensors is not None else None
        if key is not None:
            self._install(name, key)
            return
        key = f"a{next(self._keys)}"
        try:
            if self.model is self.base_model:
                self.model = PeftModel.from_pretrained(self.base_model, path, adapter_name=key)
                self.model.eval()
            else:
                # low_cpu_mem_usage: the new LoRA weights start on the meta device instead of
                # being initialised only to be overwritten (a third of the load time).
                self.model.load_adapter(
                    path, adapter_name=key, is_trainable=False, low_cpu_mem_usage=True
                )
        except (RuntimeError, ValueError, KeyError) as exc:
            if self.model is not self.base_model and key in self.model.peft_config:
                self._delete_keys([key])
            raise UsageError(f"cannot load adapter {name!r} from {path}: {exc}") from exc
        self._install(name, key)

    def unload(self, name: str) -> None:
        """Retire adapter `name`; its key is freed once no running row uses it."""
        if name not in self.adapters:
            raise UsageError(f"no adapter named {name!r} is loaded")
        self.retired.add(self.adapters.pop(name))
        self.free_retired()

    def free_retired(self) -> None:
        """Delete the retired keys no row uses, keeping one (not the merged one) as the spare
        while adapters are loaded; with none left, the spare goes too."""
        if not self.retired and (self.spare is None or self.adapters):
            return
        in_use = self._in_use()
        free = sorted(self.retired - in_use)
        self.retired.difference_update(free)
        for key in free:  # deleted, or kept as the spare: no request reaches them again
            if key in self._identity:
                self._prefix.retire(self._identity.pop(key))
        if not self.adapters and self.spare is not None:
            free.append(self.spare)  # nothing left to load into it
            self.spare = None
        elif self.adapters and self.spare is None:
            keep = [k for k in free if k != self.merged_key]
            if keep:
                self.spare = keep[-1]  # kept for the next load (_load_into_spare)
                free.remove(self.spare)
        self._delete_keys(free)

    def _install(self, name: str, key: str) -> None:
        # New weights under `key`: a new identity, so no KV computed before is served.
        if key in self._identity:
            self._prefix.retire(self._identity[key])
        self._identity[key] = f"{key}.{next(self._loads)}"
        old = self.adapters.get(name)
        self.adapters[name] = key
        if old is not None:
            self.retired.add(old)
        if self._merge_latest:
            self._merge_adapter(key)

    def _load_into_spare(self, path: str, tensors: dict[str, torch.Tensor]) -> str | None:
        """Write the adapter at `path` (its `tensors`, as `_check_adapter_fits` read them)
        into the spare key's LoRA weights, in place, and return that key; None (nothing
        changed) when there is no spare or the adapter's settings or tensors differ from the
        spare's. Creating a key costs peft a new module per target layer (about 0.35 s on
        SmolLM2); a step's new adapter usually replaces one just freed."""
        key = self.spare
        if key is None:
            return None
        from peft import LoraConfig

        try:
            config = LoraConfig.from_pretrained(path)
        except Exception:
            return None
        have = self.model.peft_config[key]
        same = ("r", "lora_alpha", "target_modules", "use_dora", "use_rslora", "fan_in_fan_out")
        if any(getattr(config, k) != getattr(have, k) for k in same):
            return None
        modules = dict(self.model.named_modules())
        targets: list[tuple[torch.Tensor, torch.Tensor]] = []
        for k, v in tensors.items():
            mod_name, _, part = k.partition(".lora_")
            layers = getattr(modules.get(mod_name), f"lora_{part[:1]}", None)
            if part not in ("A.weight", "B.weight") or layers is None or key not in layers:
                return None
            weight = layers[key].weight
            if weight.shape != v.shape:
                return None
            targets.append((weight, v))
        if len(targets) != sum(key in getattr(m, "lora_A", {}) for m in modules.values()) * 2:
            return None  # not every layer of the spare would be written
        with torch.no_grad():
            for weight, v in targets:
                weight.copy_(v)
        self.spare = None
        return key

    def _merge_adapter(self, key: str) -> None:
        """Make `self.merged` the base weights plus adapter `key` (see `merge_latest`)."""
        from peft.tuners.lora.layer import LoraLayer

        lora = {
            name.removeprefix("base_model.model."): module
            for name, module in self.model.named_modules()
            if isinstance(module, LoraLayer) and key in module.lora_A
        }
        if self._packs():
            self._merge_packed(key, lora)
        elif self.merged is None:
            import copy

            self.merged = copy.deepcopy(self.model).merge_and_unload(adapter_names=[key]).eval()
        else:
            for name, module in lora.items():
                _merge_into(self.merged.get_submodule(name).weight, module, key)
        self.merged_key = key

    def _packs(self) -> bool:
        """Whether the engine's linear layers multiply by packed weights (`prepack_weights`)."""
        return self._prepack_weights and can_pack(self._shared_base.device, self._shared_base.dtype)

    def _merge_packed(self, key: str, lora: dict[str, Any]) -> None:
        """The merged copy without a dense copy of the weights: a module tree over the base's
        tensors (`model_over`, no copy) whose layers adapter `key` targets multiply by packed
        base + LoRA weights (each merged weight a temporary), the others by the base's own
        packed copies. The base gives up its packed copies of the targeted layers (the
        merged copy serves their adapter; batches of the base or of several adapters run
        them through `F.linear`) until the merged copy is dropped: one packed copy of each
        layer in memory, not two."""
        from art_langgraph.engine.shared_base import model_over

        if self.merged is None:
            self.merged = model_over(self._shared_base.tensors, self.base_model).eval()
        base = dict(self.base_model.named_modules())
        for name, module in self.merged.named_modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            own = base.get(f"{name}.base_layer", base.get(name))
            assert own is not None, name  # the same architecture (model_over checked it)
            if name in lora:
                merged = _merged_weight(own.weight, lora[name], key)
                module.__class__ = PackedLinear
                module.set_packed(packed_weight(merged))  # type: ignore[operator]
                del merged
                if isinstance(own, PackedLinear):
                    own._packed = None
            elif isinstance(own, PackedLinear) and own._packed is not None:
                module.__class__ = PackedLinear
                module.set_packed(own._packed)  # type: ignore[operator]
            elif isinstance(module, PackedLinear):  # a target of an earlier adapter only
                module._packed, module._packed_only = None, False  # the base's weight, unpacked

    def _delete_keys(self, keys: list[str]) -> None:
        if not keys or self.model is self.base_model:
            return
        if self.merged_key in keys:
            self.merged, self.merged_key = None, None
            if self._packs():
                pack_linears(self.base_model, missing_only=True)  # what the base gave up
        left = set(self.model.peft_config) - set(keys)
        if not left:
            # peft keeps pointing at a deleted active adapter: go back to the plain model.
            self.base_model = self.model.unload()
            self.model = self.base_model
            return
        if self.model.active_adapter in keys:
            self.model.set_adapter(
                sorted(left)[0]
            )  # rows pick adapters by name; this is peft's default
        for key in keys:
            with contextlib.suppress(Exception):
                self.model.delete_adapter(key)


def _merge_into(out: torch.Tensor, module: Any, key: str) -> None:
    """out = base weight + scale * B @ A, in one pass over the weight (an `addmm` into
    `out`, no temporary of the weight's size). DoRA and fan-in-fan-out layers take peft's
    own delta."""
    base = module.base_layer.weight
    if module.use_dora.get(key) or getattr(module, "fan_in_fan_out", False):
        out.copy_(base + module.get_delta_weight(key))
        return
    a, b = module.lora_A[key].weight, module.lora_B[key].weight  # (r, in), (out, r)
    torch.addmm(base, b.to(base.dtype), a.to(base.dtype), alpha=module.scaling[key], out=out)


def _merged_weight(base: torch.Tensor, module: Any, key: str) -> torch.Tensor:
    """A new tensor: `base` (the LoRA layer's base weight) + scale * B @ A."""
    out = torch.empty_like(base)
    _merge_into(out, module, key)
    return out


def _check_adapter_fits(model: Any, name: str, path: str) -> dict[str, torch.Tensor] | None:
    """Refuse, before touching the model, an adapter whose LoRA shapes do not fit it or
    whose weights are not all finite (it would serve one token over and over). Returns the
    LoRA tensors it read (None for a .bin adapter), so a load need not read them again."""
    from safetensors import safe_open

    files = list(Path(path).glob("adapter_model.safetensors"))
    if not files:
        return None  # a .bin adapter: peft checks it (we never unpickle it ourselves)
    modules = dict(model.named_modules())
    try:
        handle = safe_open(str(files[0]), framework="pt")
    except Exception as exc:  # safetensors raises its own error type for a bad header
        raise UsageError(
            f"adapter {name!r}: {files[0]} is not a readable safetensors file ({exc})"
        ) from exc
    tensors: dict[str, torch.Tensor] = {}
    with handle as f:
        for k in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
            tensors[k] = f.get_tensor(k)
            if ".lora_A." not in k and ".lora_B." not in k:
                continue
            target = k.split(".lora_")[0].removeprefix("base_model.model.")
            module = modules.get(target)
            shape = tensors[k].shape
            if module is None or not hasattr(module, "in_features"):
                raise UsageError(
                    f"adapter {name!r} targets {target!r}, which this base model does not have"
                )
            want = module.in_features if ".lora_A." in k else module.out_features
            got = shape[1] if ".lora_A." in k else shape[0]
            if got != want:
                raise UsageError(
                    f"adapter {name!r} does not fit this base model: {target} has {want} "
                    f"features, the adapter has {got} (was it trained on another base model?)"
                )
            if not bool(torch.isfinite(tensors[k]).all()):
                raise UsageError(f"adapter {name!r}: {k} holds NaN or infinite weights")
    return tensors
