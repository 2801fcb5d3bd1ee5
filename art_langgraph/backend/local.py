"""`LocalBackend`: the engine, the server and the trainer, embedded in the user's process.

`await model.register(backend)` starts (once) a torch engine for the base model and
the OpenAI-compatible server on 127.0.0.1, then resumes the model from its last
complete checkpoint if its folder has one. `model.train(groups)`:

1. checks the groups (no pending rollouts; empty, zero-variance and too-stale groups
   are skipped and counted), computes advantages per group, and writes the
   trajectories to `trajectories/train/{step:04d}.jsonl` *before* training;
2. tensorizes token-exactly and runs one GRPO optimizer step in a worker thread
   (the event loop stays free); with nothing trainable the step still advances and
   the checkpoint is carried forward, and the metrics say why;
3. writes checkpoint N+1 atomically, loads it into the engine and makes it the
   latest step, so the next request for `name` is served by N+1 (`model` says so).

While a step trains, requests for the model's latest step wait (ART's semantics)
unless `ModelConfig.serve_during_training` is set; pinned steps are always served.
With `ModelConfig.promote_on_evaluation`, the bare name serves the promoted step
(`promotion.py`: `record_evaluation` decides, `promotion.jsonl` in the folder remembers)
and never waits; `name@latest` is the latest step.

One backend serves one base model. With `trainer_ranks` > 1 the trainer is data-parallel
ranks in worker processes (`scaleout/distributed.py`) behind the same `Trainer` protocol.
With `ray`, the replicas and the ranks are Ray actors (`scaleout/ray_cluster.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_langgraph.backend import base
from art_langgraph.backend.base import ModelRef, TrainableModelRef, TrainResult, is_trainable
from art_langgraph.backend.checkpoints import CheckpointFolder, CheckpointStore
from art_langgraph.backend.choices import EngineChoice, EngineKind, ServerChoice, TrainerChoice
from art_langgraph.backend.engines import start_engine
from art_langgraph.backend.promotion import PromotionDecision, PromotionLog
from art_langgraph.backend.shutdown import OwnedResources, stop_at_exit
from art_langgraph.backend.trainers import build_trainer
from art_langgraph.engine.base import InferenceEngine
from art_langgraph.errors import CheckpointError, UsageError
from art_langgraph.runtime.heap import release_free_memory
from art_langgraph.runtime.names import check_path_name, inference_name
from art_langgraph.serving.app import create_app
from art_langgraph.serving.config import ServerConfig
from art_langgraph.serving.registry import ModelRegistry
from art_langgraph.serving.runner import ServerHandle, start_app_server
from art_langgraph.training.base import ProgressFn, Trainer
from art_langgraph.training.config import ModelConfig, TrainConfig
from art_langgraph.training.prepare import prepare_step
from art_langgraph.training.sft import run_sft, sft_sequences
from art_langgraph.training.tensorize import TrainSequence
from art_langgraph.trajectories.loggers import LoggerSet, RunInfo, TrajectoryLogger
from art_langgraph.trajectories.records import finite_numbers
from art_langgraph.trajectories.trajectory import TrajectoryGroup, as_groups, write_jsonl

log = logging.getLogger(__name__)


@dataclass
class _Run:
    model: ModelRef
    store: CheckpointStore
    step: int = 0
    trainer: Trainer | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    loaded: list[int] = field(default_factory=list)
    """Steps whose adapter the engine holds now, oldest first."""
    promotion: PromotionLog | None = None
    """The promotion history, with `ModelConfig.promote_on_evaluation`."""

    @property
    def training(self) -> ModelConfig:
        """The model's training settings (a model that is not trainable never trains)."""
        if not is_trainable(self.model):
            raise UsageError(f"model {self.model.name!r} is not trainable")
        return self.model.training


class LocalBackend:
    """Engine + server + trainer in this process. Use `async with LocalBackend() as backend:`."""

    def __init__(
        self,
        path: str | Path = ".art",
        *,
        engine: EngineChoice | EngineKind = "auto",
        trainer: TrainerChoice | None = None,
        server: ServerChoice | None = None,
        server_config: ServerConfig | None = None,
        loggers: list[TrajectoryLogger] | None = None,
        replicas: int | None = None,
        ray: str | None = None,
        trainer_ranks: int | None = None,
    ) -> None:
        """`path`: where models live on disk ({path}/{project}/models/{name}).

        What runs (`backend/choices.py`): `engine`, an `EngineChoice` or its kind ("auto":
        vLLM with a GPU and `.venv-vllm`, else our torch engine; "torch"; "vllm");
        `trainer`, a `TrainerChoice` (default: one trainer in this process); `server`, a
        `ServerChoice` (default: 127.0.0.1 on a free port, no key); `server_config`: the
        OpenAI server's limits and timeouts. `replicas`, `ray` and `trainer_ranks` are
        shorthands for `EngineChoice.replicas`, `EngineChoice.ray_address` and
        `TrainerChoice.ranks`.

        `loggers`: where trajectories and metrics also go (`LangfuseLogger`, `WandbLogger`);
        None: a `LangfuseLogger` when `LANGFUSE_PUBLIC_KEY`/`LANGFUSE_SECRET_KEY` are set,
        else none."""
        if not isinstance(engine, EngineChoice):
            engine = EngineChoice(engine)
        if replicas is not None or ray is not None:
            engine = dataclasses.replace(
                engine,
                replicas=engine.replicas if replicas is None else replicas,
                ray_address=engine.ray_address if ray is None else ray,
            )
        trainer = trainer or TrainerChoice()
        if trainer_ranks is not None:
            trainer = dataclasses.replace(trainer, ranks=trainer_ranks)
        if trainer.fsdp and trainer.ranks == 1 and engine.ray_address is None:
            raise UsageError(
                "trainer_fsdp=True shards the trainer over its ranks, and with trainer_ranks=1 "
                "and no ray there is one plain trainer: set trainer_ranks >= 2, or leave "
                "trainer_fsdp at None (automatic)"
            )
        self.path = Path(path).resolve()
        self.engine_choice = engine
        """The inference engine asked for (`backend/engines.py` starts it)."""
        self.trainer_choice = trainer
        """The trainer asked for (`backend/trainers.py` builds it)."""
        self.server_choice = server or ServerChoice()
        """Where the OpenAI server listens, or that there is none."""
        self.server_config = server_config
        self._ray: Any = None
        self._share: Any = None
        self.registry: ModelRegistry | None = None
        self.app: Any = None
        """The OpenAI ASGI app, once the engine runs (with or without a server of our own)."""
        self._base_model: str | None = None
        self._base_path: str | None = None
        self._runs: dict[str, _Run] = {}
        self.loggers = LoggerSet(loggers)
        self._owned = OwnedResources(self.loggers)
        # A script that never closes the backend (ART's examples do not) still stops what it
        # started, in order, and flushes its loggers: when the backend is collected, or at
        # interpreter exit (shutdown.py says why that must come before Python's teardown).
        self._finalizer = stop_at_exit(self, self._owned)

    @property
    def engine(self) -> InferenceEngine | None:
        """The inference engine, once the first model is registered (None after `close`)."""
        return self._owned.engine

    @property
    def server(self) -> ServerHandle | None:
        """The OpenAI server's handle, with `http=True` (None after `close`)."""
        return self._owned.server

    async def __aenter__(self) -> LocalBackend:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the server, the engine and the trainers' processes, flush the loggers.
        Checkpoints are already on disk. Idempotent; `close_sync` is the same without a loop.

        The worker thread gets the finalizer, not a method of this backend: the executor's
        thread drops its work item only after the awaiting task has resumed, so a bound
        method could keep a backend its caller just deleted alive past a `gc.collect()`
        (with its app, and the app's engine, on a loaded host)."""
        await asyncio.to_thread(self._finalizer)

    def close_sync(self) -> None:
        """`close` for code with no event loop (it blocks). Also what runs at interpreter exit
        for a backend nobody closed."""
        self._finalizer()  # once, whoever calls it first

    # ---------------------------------------------------------------- register
    async def register(self, model: ModelRef) -> None:
        self._check_open()
        if self._base_model is not None and model.base_model != self._base_model:
            raise UsageError(
                f"this backend serves {self._base_model!r}; model {model.name!r} wants {model.base_model!r}: "
                "use one LocalBackend per base model"
            )
        check_path_name(model.name, "model name")  # fields may have been reassigned since
        check_path_name(model.project, "project")
        store = CheckpointStore(CheckpointFolder.of(self.path, model.project, model.name).root)
        if recovered := store.reconcile_history():
            log.warning(
                "%s: history lines of steps %s restored from checkpoints", model.name, recovered
            )
        for step in store.steps():
            trained_on = store.meta(step).get("base_model")
            if trained_on not in (None, model.base_model):
                raise UsageError(
                    f"checkpoint {step} of {model.name!r} was trained on {trained_on!r}, not "
                    f"{model.base_model!r}: use the same base_model, or another name/project"
                )
        training = model.training if is_trainable(model) else None
        if self.engine is None:
            rank = training.lora_r if training else 8
            await asyncio.to_thread(self._start, model.base_model, store.root, rank)
        rank_limit = self._engine().traits.max_lora_rank
        if training and rank_limit is not None and training.lora_r > rank_limit:
            raise UsageError(
                f"lora_r={training.lora_r} is above the engine's max_lora_rank={rank_limit}"
            )
        assert self.registry is not None
        run = _Run(model, store)
        self._runs[model.name] = run
        self.registry.add_model(model.name)
        for step in store.steps():
            self.registry.set_step(
                model.name, step, _adapter(model.name, step), str(store.path(step))
            )
        if model.trainable:
            await self._resume(run)
        if training and training.promote_on_evaluation:
            run.promotion = PromotionLog(store.root)
            if started := run.promotion.start(run.step):
                log.info("%s: %s", model.name, started.reason)
            self.registry.set_promotion(model.name, run.promotion.served)
        else:
            self.registry.set_promotion(model.name, None)
        if self.server is not None:
            model.inference_base_url = self.server.base_url
            model.inference_api_key = self.server_choice.api_key or "local"

    @property
    def base_model(self) -> str | None:
        """The base model this backend serves (None until the first register)."""
        return self._base_model

    async def _resume(self, run: _Run) -> None:
        """Serve the last checkpoint that loads; one that does not is set aside, never deleted."""
        assert self.registry is not None
        for step in reversed(run.store.steps()):
            try:
                await self._load(run, step)
            except UsageError as exc:
                aside = run.store.set_aside(step, str(exc))
                self.registry.drop_step(run.model.name, step)
                log.warning(
                    "checkpoint %d of %s does not load (%s); set aside as %s",
                    step,
                    run.model.name,
                    exc,
                    aside,
                )
                continue
            run.step = step
            return

    def _engine(self) -> InferenceEngine:
        """The engine, which the first `register` starts."""
        if self.engine is None:
            raise UsageError("this backend runs no engine yet: await model.register(backend) first")
        return self.engine

    def _start(self, base_model: str, folder: Path, lora_rank: int) -> None:
        from art_langgraph.presets import resolve_preset

        self._base_path = resolve_preset(base_model)
        # logs (vLLM's, the replicas') land in the first model's folder: one engine serves all
        started = start_engine(
            self.engine_choice,
            self._base_path,
            folder / "logs",
            lora_rank,
            self.trainer_choice.ranks,
        )
        self._owned.engine = started.engine
        self._ray, self._share = started.ray, started.share
        if started.ray_started:  # the Ray instance "local" started in this process ends with us
            self._owned.ray = started.ray
        self.registry = ModelRegistry(base_model)
        where = self.server_choice
        self.app = create_app(
            started.engine, self.registry, api_key=where.api_key, config=self.server_config
        )
        if where.http:
            self._owned.server = start_app_server(
                self.app,
                host=where.host,
                port=where.port,
                api_key=where.api_key,
                config=self.server_config,
            )
        self._base_model = base_model

    def _check_open(self) -> None:
        if not self._finalizer.alive:
            raise UsageError("this LocalBackend is closed: make a new one to serve or train models")

    def _run(self, model: ModelRef) -> _Run:
        self._check_open()
        run = self._runs.get(model.name)
        if run is None or (run.model is not model and run.model.project != model.project):
            raise UsageError(f"model {model.name!r} is not registered with this backend")
        return run

    async def _load(self, run: _Run, step: int) -> None:
        """Load checkpoint `step` into the engine, make it latest, and unload old steps."""
        assert self.registry is not None
        name = run.model.name
        path = str(run.store.path(step))
        await self._engine().load_adapter(_adapter(name, step), path)
        self.registry.set_step(name, step, _adapter(name, step), path)
        run.loaded.append(step)
        while len(run.loaded) > self.engine_choice.max_loaded_adapters:
            old = run.loaded.pop(0)
            await self._engine().unload_adapter(_adapter(name, old))

    def _build_trainer(self, run: _Run) -> Trainer:
        """A trainer holding exactly the latest checkpoint (adapter and optimizer)."""
        assert self._base_path is not None
        return build_trainer(
            self.trainer_choice,
            self._base_path,
            run.training,
            self.engine_choice.device,
            self._engine().traits,
            run.store.path(run.step) if run.step > 0 else None,
            ray=self._ray,
            share=self._share,
        )

    async def _trainer(self, run: _Run) -> Trainer:
        """The run's trainer, built on first use. A latest checkpoint whose trainer state does
        not load (a corrupt optimizer file) is set aside like one that does not serve, and
        training goes on from the one before it, never from a fresh optimizer."""
        assert self.registry is not None
        while run.trainer is None:
            try:
                run.trainer = await asyncio.to_thread(self._build_trainer, run)
                self._owned.trainers[run.model.name] = run.trainer
            except CheckpointError as exc:
                bad = run.step
                aside = run.store.set_aside(bad, str(exc))
                self.registry.drop_step(run.model.name, bad)
                if bad in run.loaded:
                    run.loaded.remove(bad)
                    await self._engine().unload_adapter(_adapter(run.model.name, bad))
                log.warning(
                    "checkpoint %d of %s cannot resume training (%s); set aside as %s",
                    bad,
                    run.model.name,
                    exc,
                    aside,
                )
                run.step = 0
                await self._resume(run)
        return run.trainer

    # ------------------------------------------------------------------- train
    async def get_step(self, model: ModelRef) -> int:
        return self._run(model).step

    async def train(
        self,
        model: TrainableModelRef,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        progress: ProgressFn | None = None,
        *,
        request_id: str | None = None,
    ) -> TrainResult:
        """One GRPO step (see the module docstring). `request_id`: a retry of a request whose
        step was already committed returns that step's result instead of training again."""
        config = config.for_model(model.base_model)
        run = self._run(model)
        async with run.lock:
            if request_id and (done := self._replay(run, request_id)):
                return done
            await self._trainer(run)  # may fall back a step (a checkpoint that cannot resume)
            new_step = run.step + 1
            seqs, metrics = prepare_step(
                groups,
                config,
                new_step,
                tokenizer=self._engine().tokenizer,
                vocab_size=self._engine().vocab_size,
            )
            self.loggers.trajectories(_info(run), new_step, "train", groups)
            write_jsonl(run.store.trajectories_path("train", new_step), groups)
            result = await self._commit(
                run, new_step, metrics, lambda t: _rl(t, seqs, config, progress), request_id
            )
            self.loggers.metrics(_info(run), result.step, "train", result.metrics)
            return result

    def _replay(self, run: _Run, request_id: str) -> TrainResult | None:
        found = run.store.find_request(request_id)
        if found is None:
            return None
        step, metrics = found
        log.info(
            "%s: request %s was committed as step %d; not training again",
            run.model.name,
            request_id,
            step,
        )
        return TrainResult(step=step, metrics={**metrics, "replayed": 1.0})

    async def _commit(
        self,
        run: _Run,
        new_step: int,
        metrics: dict[str, float],
        work: Any,
        request_id: str | None,
    ) -> TrainResult:
        """Train (in a thread), checkpoint atomically, swap the adapter in; the step advances."""
        assert self.registry is not None
        name = run.model.name
        paused = not (is_trainable(run.model) and run.model.training.serve_during_training)
        if paused:
            self.registry.pause(name)
            await self._engine().reset_prefix_cache()  # its KV is of the weights being replaced
        t0 = time.perf_counter()
        trim: asyncio.Future[bool] | None = None
        try:
            trainer = await self._trainer(run)
            try:
                metrics.update(await asyncio.to_thread(work, trainer))
                meta: dict[str, Any] = {
                    "base_model": run.model.base_model,
                    "metrics": finite_numbers(metrics),
                }
                if request_id:
                    meta["request_id"] = request_id
                await asyncio.to_thread(run.store.write, new_step, trainer.save, meta)
            except BaseException:
                # All or nothing: the trainer may hold an update that no checkpoint has; drop
                # it, so the next step starts again from the latest checkpoint on disk.
                trainer.close()  # a distributed trainer's ranks (stopped already if one failed)
                run.trainer = None
                self._owned.trainers.pop(run.model.name, None)
                raise
            finally:
                # The step's activations, back to the OS (heap.py), beside the swap:
                # malloc_trim runs without the GIL.
                trim = asyncio.ensure_future(asyncio.to_thread(release_free_memory))
            t_swap = time.perf_counter()
            await self._load(run, new_step)
            run.step = new_step
            metrics["swap_seconds"] = time.perf_counter() - t_swap
        finally:
            if trim is not None:
                await trim
            if paused:
                self.registry.resume(name)
        metrics["step_seconds"] = time.perf_counter() - t0
        record: dict[str, Any] = {"step": new_step, "split": "train", "time": time.time()}
        if request_id:
            record["request_id"] = request_id
        run.store.append_history({**record, **finite_numbers(metrics)})
        return TrainResult(step=new_step, metrics=metrics)

    async def train_sft(
        self,
        model: TrainableModelRef,
        items: list[Any],
        config: TrainConfig,
        epochs: int,
        batch_size: int,
        *,
        stop_loss: float | None = None,
        request_id: str | None = None,
    ) -> TrainResult:
        base.check_sft_args(epochs, batch_size, stop_loss)
        config = config.for_model(model.base_model)
        run = self._run(model)
        async with run.lock:
            if request_id and (done := self._replay(run, request_id)):
                return done
            await self._trainer(run)
            seqs, stats = sft_sequences(self._engine().tokenizer, items, config.max_seq_length)
            if not seqs:
                raise UsageError("train_sft got nothing to train on")
            metrics: dict[str, float] = {f"tensorize/{k}": float(v) for k, v in vars(stats).items()}

            def work(trainer: Trainer) -> dict[str, float]:
                return run_sft(trainer, seqs, config, epochs, batch_size, stop_loss)

            return await self._commit(run, run.step + 1, metrics, work, request_id)

    # --------------------------------------------------------------------- log
    async def log(self, model: ModelRef, items: list[Any], split: str) -> None:
        run = self._run(model)
        groups = as_groups(items)
        self.loggers.trajectories(_info(run), run.step, split, groups)
        write_jsonl(run.store.trajectories_path(split, run.step), groups)
        rewards = [t.reward for g in groups for t in g]
        record: dict[str, Any] = {
            "step": run.step,
            "split": split,
            "time": time.time(),
            "trajectories": len(rewards),
        }
        if rewards:
            record["reward"] = statistics.fmean(rewards)
        run.store.append_history(record)
        self.loggers.metrics(
            _info(run),
            run.step,
            split,
            {k: float(v) for k, v in record.items() if k in ("reward", "trajectories")},
        )

    # --------------------------------------------------------------- promotion
    async def record_evaluation(
        self, model: TrainableModelRef, step: int, score: float
    ) -> PromotionDecision:
        run = self._run(model)
        if run.promotion is None:
            raise UsageError(
                f"promotion is off for model {model.name!r}: register it with "
                "ModelConfig(promote_on_evaluation=True) to gate its bare name on evaluations"
            )
        decision = await asyncio.to_thread(
            run.promotion.record_evaluation,
            step,
            score,
            run.training.promotion_tolerance,
            run.store.steps(),
        )
        log.info("%s: step %d %s: %s", model.name, step, _verdict(decision), decision.reason)
        return decision

    async def delete_checkpoints(self, model: ModelRef, metric: str, keep_last: int) -> list[int]:
        run = self._run(model)
        if keep_last < 1:
            raise UsageError(
                f"keep_last must be >= 1 (the latest checkpoint is always kept), got {keep_last}"
            )
        async with run.lock:
            steps = run.store.steps()
            keep = set(steps[-keep_last:])
            split, _, key = metric.partition("/")
            scored = [
                (h[key], h["step"])
                for h in run.store.history()
                if h.get("split") == split
                and isinstance(h.get(key), int | float)
                and h["step"] in steps
            ]
            if scored:
                keep.add(max(scored)[1])
            if run.promotion is not None and (promoted := run.promotion.served()) is not None:
                keep.add(promoted)  # the step the bare name serves
            doomed = [s for s in steps if s not in keep]
            assert self.registry is not None
            for s in doomed:
                self.registry.drop_step(model.name, s)
                if s in run.loaded:
                    run.loaded.remove(s)
                    await self._engine().unload_adapter(_adapter(model.name, s))
            run.store.delete(doomed)
            return doomed


def _rl(
    trainer: Trainer,
    seqs: list[TrainSequence],
    config: TrainConfig,
    progress: ProgressFn | None,
) -> dict[str, float]:
    if not seqs:
        return {}  # nothing trainable: the adapter is carried forward unchanged
    return trainer.rl_step(seqs, config, progress)


def _info(run: _Run) -> RunInfo:
    m = run.model
    return RunInfo(name=m.name, project=m.project, base_model=m.base_model, folder=run.store.root)


def _verdict(decision: PromotionDecision) -> str:
    return "promoted" if decision.promoted else "not promoted"


def _adapter(name: str, step: int) -> str:
    return inference_name(name, step)
