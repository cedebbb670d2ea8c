"""pagedattn.LLM on CUDA: a small llama GGUF file (written here: quantised blocks and a byte-level
BPE tokenizer, tests/fuzz/make_corpus.py's writer) served from Python on the GPU, against the same
engine on the CPU and against itself (a batch and each prompt alone, streaming and a whole call).
Skips without a CUDA device."""

import importlib.util
import sys

import pytest

import pagedattn
from pagedattn import SamplingParams

from conftest import REPO

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
PROMPTS = [[5, 17, 200, 31], [9], [100, 101, 102, 103, 104, 105, 106], [40, 41, 42, 43, 44, 45]]


def _make_gguf(path):
    spec = importlib.util.spec_from_file_location(
        "make_gguf_model", REPO / "scripts" / "device" / "make_gguf_model.py")
    if spec is None or not (REPO / "tests" / "fuzz" / "make_corpus.py").is_file():
        pytest.skip("the GGUF writer (scripts/device, tests/fuzz) is not in this tree")
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(REPO / "tests" / "fuzz"))
    spec.loader.exec_module(mod)
    _, data = mod.model(2)
    path.write_bytes(data)
    return str(path)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    if not pagedattn.built_with_cuda or pagedattn.cuda_device_count() == 0:
        pytest.skip("no CUDA device")
    return _make_gguf(tmp_path_factory.mktemp("cuda_llm") / "small.gguf")


@pytest.fixture(scope="module")
def gpu(gguf_file):
    return pagedattn.LLM(gguf_file, device="cuda", kv_cache_tokens=2048, max_model_len=256)


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_runs_on_the_gpu_and_a_batch_matches_each_prompt_alone(gpu):
    assert gpu.device == "cuda"
    batch = gpu.generate(PROMPTS, GREEDY)
    assert [len(t) for t in _tokens(batch)] == [GREEDY.max_tokens] * len(PROMPTS)
    for prompt, out in zip(PROMPTS, batch):
        alone = gpu.generate([prompt], GREEDY)[0]
        assert alone.outputs[0].token_ids == out.outputs[0].token_ids
        assert alone.outputs[0].text == out.outputs[0].text


def test_streaming_yields_the_whole_call(gpu):
    whole = gpu.generate([PROMPTS[0]], GREEDY)[0].outputs[0]
    deltas = list(gpu.stream(PROMPTS[0], GREEDY))
    assert sum((d.token_ids for d in deltas), []) == whole.token_ids
    assert "".join(d.text for d in deltas) == whole.text


def test_greedy_tokens_follow_the_cpu_engine(gpu, gguf_file):
    # The CPU runner computes in f32 over the file's blocks, the GPU in bf16: a near tie may
    # choose another token, after which the texts part. Each prompt's first token must agree, and
    # the continuations agree up to where they part in most prompts.
    cpu = pagedattn.LLM(gguf_file, device="cpu", kv_cache_tokens=2048, max_model_len=256)
    g = _tokens(gpu.generate(PROMPTS, GREEDY))
    c = _tokens(cpu.generate(PROMPTS, GREEDY))
    agree = []
    for a, b in zip(g, c):
        n = 0
        while n < len(a) and a[n] == b[n]:
            n += 1
        agree.append(n)
    print("tokens agreeing before the texts part, per prompt:", agree)
    assert all(n >= 1 for n in agree), (g, c)
    assert sum(n == GREEDY.max_tokens for n in agree) >= len(PROMPTS) - 1, (g, c)


def test_bad_requests_are_refused_and_the_engine_goes_on(gpu):
    with pytest.raises(Exception):
        gpu.generate([[10 ** 9]], GREEDY)  # a token outside the vocabulary
    assert len(gpu.generate([PROMPTS[1]], GREEDY)[0].outputs[0].token_ids) == GREEDY.max_tokens
