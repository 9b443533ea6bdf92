#!/usr/bin/env python3
"""Records llama.cpp's image embeddings and the greedy answer to a question about an image, on
Rill's test projectors (`scripts/make-test-projectors.py`) and the text model each pairs with,
into `crates/rill-engine/tests/fixtures/reference/<projector>.image.json` (a projector's
second text model: `<projector>.<model>.image.json`), tied to the projector,
the model and the image by SHA-256. Rill's parity test (`tests/vision.rs`) compares against it,
so CI needs no llama.cpp. Needs llama-cpp-python 0.3.36 (its `libmtmd`, llama.cpp's multimodal
library, through `llama_cpp.mtmd_cpp`).

    python3 scripts/record-reference-images.py [PROJECTOR ...]

The images: llama.cpp's own `tools/mtmd/test-1.jpeg` (640×488, from the source the other
assets come from: `scripts/llama-cpp-source.sh`), and `tests/fixtures/images/shapes.png`
(300×200), lossless, so that preprocessing is held to llama.cpp's exactly (JPEG decoders may
differ by a few levels; the spec allows it). Recorded per image:
- `embeddings`: mtmd's output for the image (`mtmd_encode_chunk`, `mtmd_get_output_embd`):
  one row per image token, the text model's width;
- the prompt as mtmd splits it: the text chunks' token ids (its image markers tokenized as text)
  around the image chunk's place;
- `greedy`: 24 tokens llama.cpp generates greedily after it, with each step's top-two gap;
- `first_logits`: the first step's 32 highest logits (id, value).
"""

import ctypes
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import llama_cpp.llama_cpp as low
import llama_cpp.mtmd_cpp as mtmd
from llama_cpp import Llama

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates/rill-engine/tests/fixtures/reference"
MODELS = ROOT / "models/test-models"
MARKER = mtmd.mtmd_default_marker().decode()
# Each projector, the text model it pairs with (the same width), and the prompt: the family's
# turn markers (Gemma's are plain text in its test model's vocabulary), the image where mtmd's
# marker is.
PAIRS = [
    ("gemma3-mmproj-test.F16", "gemma3v-test.Q8_0",
     "<start_of_turn>user\n" + MARKER
     + "What is in this picture?<end_of_turn>\n<start_of_turn>model\n"),
    ("qwen25vl-mmproj-test.F16", "qwen2vl-test.Q8_0",
     "<|im_start|>user\n" + MARKER + "What is in this picture?<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen2vl-mmproj-test.F16", "qwen2vl-test.Q8_0",
     "<|im_start|>user\n" + MARKER + "What is in this picture?<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen3vl-mmproj-test.F16", "qwen3vl-test.Q8_0",
     "<|im_start|>user\n" + MARKER + "What is in this picture?<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen3vl-mmproj-test.F16", "qwen3vlmoe-test.Q8_0",
     "<|im_start|>user\n" + MARKER + "What is in this picture?<|im_end|>\n<|im_start|>assistant\n"),
    ("qwen35-mmproj-test.F16", "qwen35-test.Q8_0",
     "<|im_start|>user\n" + MARKER + "What is in this picture?<|im_end|>\n<|im_start|>assistant\n"),
    ("gemma4-mmproj-test.F16", "gemma4v-test.Q8_0",
     "<|turn>user\n" + MARKER + "What is in this picture?<turn|>\n<|turn>model\n"),
]
STEPS = 24
# The first step's highest logits kept (id, value): a closer check than the greedy choice.
TOP = 32


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def image_path() -> Path:
    src = subprocess.run(["bash", str(ROOT / "scripts/llama-cpp-source.sh")], check=True,
                         capture_output=True, text=True).stdout.strip()
    return Path(src) / "tools/mtmd/test-1.jpeg"


def record(projector: Path, model: Path, image: Path, prompt: str) -> dict:
    """One image's rows, prompt parts and greedy answer."""
    m = Llama(model_path=str(model), n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2, seed=0,
              verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu = False
    params.n_threads = 2
    params.warmup = False
    ctx = mtmd.mtmd_init_from_file(str(projector).encode(), m._model.model, params)
    assert ctx, f"mtmd refused {projector}"
    bitmap = mtmd.mtmd_helper_bitmap_init_from_file(ctx, str(image).encode(), False)
    assert bitmap, f"mtmd could not read {image}"
    chunks = mtmd.mtmd_input_chunks_init()
    text = mtmd.mtmd_input_text(prompt.encode(), len(prompt.encode()), True, True)
    bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
    assert mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(text), bitmaps, 1) == 0
    # Each image row's width: the model's, and once more per deepstack layer (Qwen3-VL).
    n_embd = low.llama_model_n_embd_inp(m._model.model)
    parts, embeddings = [], None
    for i in range(mtmd.mtmd_input_chunks_size(chunks)):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
            n = ctypes.c_size_t()
            ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            parts.append({"tokens": [ids[j] for j in range(n.value)]})
        else:
            n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            assert mtmd.mtmd_encode_chunk(ctx, chunk) == 0
            out = mtmd.mtmd_get_output_embd(ctx)
            embeddings = np.ctypeslib.as_array(out, shape=(n_tokens * n_embd,)).reshape(
                n_tokens, n_embd).copy()
            parts.append({"image": n_tokens})
    assert embeddings is not None

    # The whole prompt through llama.cpp (mtmd's helper decodes an image's rows as one batch,
    # with Gemma 3's attention among them both ways, Qwen-VL's at their M-RoPE positions),
    # then greedy steps.
    n_past = low.llama_pos(0)
    assert mtmd.mtmd_helper_eval_chunks(ctx, m._ctx.ctx, chunks, 0, 0, 512, True,
                                        ctypes.byref(n_past)) == 0
    vocab = low.llama_vocab_n_tokens(low.llama_model_get_vocab(m._model.model))
    greedy, gaps, first = [], [], None
    for _ in range(STEPS):
        row = np.ctypeslib.as_array(low.llama_get_logits_ith(m._ctx.ctx, -1), shape=(vocab,))
        order = np.argsort(-row, kind="stable")
        if first is None:
            first = [[int(i), round(float(row[i]), 5)] for i in order[:TOP]]
        greedy.append(int(order[0]))
        gaps.append(round(float(row[order[0]] - row[order[1]]), 5))
        tok = (low.llama_token * 1)(int(order[0]))
        assert low.llama_decode(m._ctx.ctx, low.llama_batch_get_one(tok, 1)) == 0
    mtmd.mtmd_input_chunks_free(chunks)
    mtmd.mtmd_bitmap_free(bitmap)
    mtmd.mtmd_free(ctx)
    rms = float(np.sqrt((embeddings ** 2).mean()))
    assert rms > 0.1, f"{projector.name}: image rows of RMS {rms}: too small to matter"
    return {
        "sha256": sha256(image),
        "parts": parts,
        "width": n_embd,
        "embeddings": [[round(float(v), 6) for v in row] for row in embeddings],
        "greedy": greedy,
        "greedy_gaps": gaps,
        "first_logits": first,
    }


def main():
    """Records every pair, or those whose projector is named on the command line."""
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = sys.argv[1:]
    images = {"test-1.jpeg": image_path(),
              "shapes.png": ROOT / "crates/rill-engine/tests/fixtures/images/shapes.png"}
    for proj, model, prompt in PAIRS:
        # A projector's first pair is recorded under its name, a later one under both names.
        first = next(m for p, m, _ in PAIRS if p == proj)
        key = proj if model == first else f"{proj}.{model}"
        if wanted and proj not in wanted and key not in wanted:
            continue
        projector, text = MODELS / f"{proj}.gguf", MODELS / f"{model}.gguf"
        doc = {
            "about": "llama.cpp's image rows and greedy answers (llama-cpp-python 0.3.36, "
                     "libmtmd), recorded by scripts/record-reference-images.py",
            "projector": projector.name,
            "projector_sha256": sha256(projector),
            "model": text.name,
            "model_sha256": sha256(text),
            "prompt": prompt,
            "images": {name: record(projector, text, path, prompt)
                       for name, path in images.items()},
        }
        answers = [tuple(i["greedy"]) for i in doc["images"].values()]
        # A parity check of the answer has teeth only if the answer depends on the image.
        assert len(set(answers)) == len(answers), f"{model}: the same answer for every image"
        out = OUT / f"{key}.image.json"
        out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
        print(f"{out}: {', '.join(doc['images'])}")


if __name__ == "__main__":
    sys.exit(main())
