"""A kind-llm model from a published checkpoint: read it (a GGUF file or a Hugging Face directory), build Genie's
graph pair (harness.llm.llama) and the tokenizer files, and fill what the spec leaves out.

The import is cached per checkpoint content, context length and prefill AR: a cache entry ``llm-import/<key>``
holds prefill.onnx, decode.onnx, tokenizer.json, tokenizer_config.json (the chat template, bos and eos tokens,
as Hugging Face lays them out), calib.txt and eval.txt (the defaults), prompts.json and import.json (the
checkpoint's config and the import's timings). Defaults: calibration and evaluation text from the Python
documentation every CPython ships (``pydoc_data.topics``), user prompts in the checkpoint's chat template, the
eos token as the stop token.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

from harness.cache import ArtifactCache
from harness.errors import ModelError
from harness.files import sha256_file, write_atomically
from harness.llm.checkpoint import Checkpoint
from harness.llm.gguf_reader import read_gguf
from harness.llm.hf_reader import read_hf
from harness.llm.llama import LlamaGraphs
from harness.models import LlmFiles

__all__ = ["DEFAULT_PROMPTS", "IMPORT_FILE", "checkpoint_digest", "chat_prompt", "import_files", "read_checkpoint",
           "trained_context", "write_import"]

IMPORT_VERSION = 7  # bump when the graphs or files an import writes change (3: 16 default prompts; 4: opset 21;
# 5: 24 default prompts; 6: 48; 7: 96)
IMPORT_FILE = "import.json"
# 96 short user questions, judged in two looks (harness.llm.steps.staged_agreement): the first 48, and all 96 only
# when the first 48 leave the greedy agreement undecided. 16 prompts that all agree are the fewest whose floored
# interval clears 0.75 (harness.stats.floored), but a quantized model rarely agrees on every token of every
# answer: SmolLM2's w8a16 agreed 0.953 on the first 16 and 0.870 [0.734, 0.969] on the first 24, undecided; over
# 48, 0.831 [0.737, 0.914] on one machine (undecided) and 0.880 [0.805, 0.945] on another (decided), a few
# flipped answers apart. Near 0.83 deciding 0.75 takes 60-100 prompts; each is one teacher-forced pass on the
# device after the template's shared start, so the second 48 run only when the first leave it open.
DEFAULT_PROMPTS = ("What is the capital of France?", "Name three primary colors.",
                   "How many legs does a spider have?", "Write one sentence about the sea.",
                   "What is the boiling point of water?", "Who wrote Romeo and Juliet?",
                   "What is the largest planet in our solar system?", "How many days are in a week?",
                   "What gas do plants take in?", "Name a fruit that is yellow.",
                   "What is two plus two?", "Which ocean is the largest?",
                   "What language is spoken in Spain?", "What do bees make?",
                   "How many hours are in a day?", "What color is the sky on a clear day?",
                   "What is the opposite of hot?", "How many continents are there?",
                   "What animal is known as the king of the jungle?", "What is frozen water called?",
                   "Who painted the Mona Lisa?", "What is the chemical symbol for gold?",
                   "How many minutes are in an hour?", "What is the tallest mountain in the world?",
                   "What is the capital of Japan?", "Name a musical instrument with strings.",
                   "How many sides does a triangle have?", "Write one sentence about the moon.",
                   "What do cows drink?", "Who was the first person to walk on the moon?",
                   "What is the fastest land animal?", "How many months are in a year?",
                   "What does a thermometer measure?", "Name a vegetable that is green.",
                   "What is ten minus three?", "Which planet is closest to the sun?",
                   "What language is spoken in Brazil?", "What do spiders spin?",
                   "How many seconds are in a minute?", "What color are ripe bananas?",
                   "What is the opposite of up?", "How many wheels does a bicycle have?",
                   "What is the largest mammal?", "What is the main ingredient of bread?",
                   "Who discovered gravity?", "What is the chemical symbol for water?",
                   "How many players are on a soccer team?", "What is the longest river in the world?",
                   "What is the capital of Italy?", "Name two farm animals.", "How many legs does a dog have?",
                   "Write one sentence about the forest.", "What is the freezing point of water?",
                   "Who wrote Hamlet?", "What is the smallest planet in our solar system?",
                   "How many days are in a year?", "What gas do humans breathe out?", "Name a fruit that is red.",
                   "What is three plus four?", "Which desert is the largest hot desert?",
                   "What language is spoken in Germany?", "What do cows give us?", "How many weeks are in a year?",
                   "What color is grass?", "What is the opposite of big?", "How many oceans are there?",
                   "What animal has a long neck and lives in Africa?", "What is water vapor?",
                   "Who painted the Starry Night?", "What is the chemical symbol for silver?",
                   "How many hours are in a week?", "What is the deepest ocean?", "What is the capital of Canada?",
                   "Name a musical instrument you blow into.", "How many sides does a square have?",
                   "Write one sentence about the sun.", "What do pandas eat?", "Who invented the telephone?",
                   "What is the largest bird?", "How many letters are in the English alphabet?",
                   "What does a compass show?", "Name a vegetable that is orange.", "What is five times two?",
                   "Which planet is known as the red planet?", "What language is spoken in Mexico?",
                   "What do caterpillars turn into?", "How many days are in February?",
                   "What color are strawberries?", "What is the opposite of fast?",
                   "How many legs does an insect have?", "What is the largest desert in the world?",
                   "What is the main ingredient of cheese?", "Who developed the theory of relativity?",
                   "What is the chemical symbol for iron?", "How many strings does a guitar have?",
                   "What is the capital of Australia?")


def read_checkpoint(path: Path) -> Checkpoint:
    """Return the checkpoint at path: a .gguf file or a Hugging Face directory (ModelError when unreadable)."""
    path = Path(path)
    if path.is_dir():
        return read_hf(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return read_gguf(path)
    if not path.exists():
        raise ModelError(f"llm.checkpoint {path}: no such file or directory (a .gguf file or a Hugging Face "
                         "directory with config.json)")
    raise ModelError(f"llm.checkpoint {path}: neither a .gguf file nor a Hugging Face directory (config.json, "
                     "*.safetensors, tokenizer.json)")


def checkpoint_digest(path: Path) -> str:
    """Return the sha256 of a checkpoint file, or of a directory's files (names and contents, sorted)."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f"{file.relative_to(path)}\0{sha256_file(file)}\0".encode())
    return h.hexdigest()


def chat_prompt(checkpoint: Checkpoint, message: str) -> str:
    """Return a user message as the checkpoint's chat template renders it for generation (the message itself
    when the checkpoint has no template)."""
    if not checkpoint.chat_template:
        return message
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        return env.from_string(checkpoint.chat_template).render(
            messages=[{"role": "user", "content": message}], add_generation_prompt=True,
            bos_token=checkpoint.bos_token or "", eos_token=checkpoint.eos_token or "")
    except TemplateError as e:
        raise ModelError(f"{checkpoint.path}: the chat template does not render ({type(e).__name__}: {e})") from None


def default_texts() -> tuple[str, str]:
    """Return (calibration text, evaluation text): the Python documentation's topics, every 8th held out."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    held_out = set(names[::8])
    return ("\n\n".join(topics[n] for n in names if n not in held_out),
            "\n\n".join(topics[n] for n in names if n in held_out))


def write_import(checkpoint: Checkpoint, out: Path, context: int, prefill_ar: int, prompts: tuple[str, ...]) -> dict:
    """Write the pair, tokenizer files, default texts and prompts of checkpoint into out; return import.json's
    content (the config and the build's seconds)."""
    start = time.perf_counter()
    graphs = LlamaGraphs(checkpoint, context)
    graphs.write(prefill_ar, out / "prefill.onnx")
    graphs.write(1, out / "decode.onnx")
    build_s = time.perf_counter() - start
    write_atomically(out / "tokenizer.json", checkpoint.tokenizer_json.encode())
    config = {"chat_template": checkpoint.chat_template, "bos_token": checkpoint.bos_token,
              "eos_token": checkpoint.eos_token}
    write_atomically(out / "tokenizer_config.json", json.dumps(config, indent=1).encode())
    calib, evaluation = default_texts()
    write_atomically(out / "calib.txt", calib.encode())
    write_atomically(out / "eval.txt", evaluation.encode())
    rendered = [chat_prompt(checkpoint, p) for p in prompts or DEFAULT_PROMPTS]
    write_atomically(out / "prompts.json", json.dumps(rendered, indent=1).encode())
    return {"checkpoint": str(checkpoint.path), "config": asdict(checkpoint.config), "context_length": context,
            "prefill_ar": prefill_ar, "graph_build_s": round(build_s, 2)}


def import_files(files: LlmFiles, cache: ArtifactCache) -> LlmFiles:
    """Return the files of a checkpoint spec with the pair, tokenizer and defaults built (cached per content)."""
    key = hashlib.sha256(json.dumps([IMPORT_VERSION, checkpoint_digest(files.checkpoint), files.context_length,
                                     files.prefill_ar, list(files.prompts)]).encode()).hexdigest()[:20]

    def build(out: Path) -> None:
        start = time.perf_counter()
        checkpoint = read_checkpoint(files.checkpoint)
        read_s = time.perf_counter() - start
        info = write_import(checkpoint, out, files.context_length, files.prefill_ar, files.prompts)
        info |= {"read_s": round(read_s, 2), "import_s": round(time.perf_counter() - start, 2)}
        write_atomically(out / IMPORT_FILE, json.dumps(info, indent=1).encode())

    entry = cache.entry("llm-import", key, build).path
    stop = files.stop_token or json.loads((entry / "tokenizer_config.json").read_text())["eos_token"]
    return replace(files, prefill=entry / "prefill.onnx", decode=entry / "decode.onnx",
                   tokenizer=entry / "tokenizer.json", eval_text=files.eval_text or entry / "eval.txt",
                   calib_text=files.calib_text or entry / "calib.txt",
                   prompts=tuple(json.loads((entry / "prompts.json").read_text())), stop_token=stop)


def trained_context(files: LlmFiles) -> int | None:
    """Return the context an imported checkpoint was trained for (its config's max_positions); None for a pair
    brought as graphs."""
    if files.checkpoint is None or files.prefill is None:
        return None
    return json.loads((files.prefill.parent / IMPORT_FILE).read_text())["config"].get("max_positions")
