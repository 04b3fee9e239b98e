"""Fuzzing every command under a time budget: no traceback, no hang, only documented exit statuses,
JSON that parses and fits its schema, and ``fmt`` idempotent and round-tripping.

Three sources of cases, all from fixed seeds (a failure reproduces):

- grammar-driven: random derivations of grammar/placement.lark (names drawn from a pool that
  makes some of them resolve, hostile numbers, comments between tokens);
- mutations of every shipped example: lines deleted, duplicated, swapped or truncated, numbers
  replaced by hostile ones (0, negative, fractions, 1e999999), names swapped, braces dropped,
  comments inserted, CR and CRLF line endings, a byte-order mark;
- hostile flags and files: time limits, --set values, widths, device counts, /dev/zero, a
  FIFO, a folder, a missing file, standard input, as the spec and as an import;
- mutations of the shipped configurations and traces (values of the wrong type, over-long
  integers, dropped keys, truncation, deep nesting) for every importer and ``lift``.

Commands run in worker processes (tests/fuzz_worker.py); one that does not answer within
``CASE_SECONDS`` is a hang. The budget (``PLACEMENT_FUZZ_SECONDS``, default 40 s) bounds the
generated specs, which run until it is spent after the hostile lines, which always run in full.
``PLACEMENT_FUZZ_SEED`` (default 11) picks another sequence of generated specs.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from placement_logic.diagnostics import DiagnosticError
from placement_logic.frontend.canonical import format_source
from placement_logic.frontend.parser import build_parser, parse
from tests.jsonschema_lite import errors as schema_errors

ROOT = Path(__file__).resolve().parent.parent
BUDGET = float(os.environ.get("PLACEMENT_FUZZ_SECONDS", "40"))
CASE_SECONDS = 20.0  # an answer later than this is a hang
WORKERS = 2
EXITS = {"fmt": {0, 1, 2}, "inspect": {0, 2}, "cost": {0, 1, 2, 3}, "compare": {0, 1, 2, 3}, "search": {0, 1, 2},
         "check": {0, 1, 2, 3}, "prove": {0, 1, 2, 3}, "measure": {0, 1, 2, 4}, "import": {0, 1, 2},
         "lift": {0, 1, 2}}
SCHEMA = {"inspect": "inspect", "cost": "cost", "compare": "cost", "check": "check", "prove": "prove",
          "measure": "measure"}
EXAMPLES = sorted(ROOT.glob("examples/**/*.place"))


# --------------------------------------------------------------------------- workers


class Worker:
    def __init__(self):
        env = dict(os.environ, PYTHONPATH=str(ROOT), PLACEMENT_NO_CACHE="1", COLUMNS="100")
        env.pop("NO_COLOR", None)
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fuzz_worker.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)

    def ask(self, argv: list[str], stdin: str | None) -> dict | None:
        """The answer, or None when none came in time (the worker is then killed)."""
        self.proc.stdin.write(json.dumps({"argv": argv, "stdin": stdin}) + "\n")
        self.proc.stdin.flush()
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(CASE_SECONDS)
        if not box:
            self.proc.kill()
            self.proc.wait()
            return None
        return json.loads(box[0])

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


# --------------------------------------------------------------------------- grammar-driven generation

NAMES = ["dp", "tp", "pp", "psi", "K", "x", "zero3", "ddp", "zero1", "megatron_tp", "std", "data", "tensor",
         "params", "grads", "optimizer", "activations", "R", "S", "M", "O", "model_state", "memory", "comm",
         "volume", "p", "q", "expect", "fails", "unless", "ψ", "a_1", "hidden", "layers", "heads", "transformer",
         "bytes", "microbatches", "seq", "microbatch", "role", "link", "inter_node", "pipeline", "one_f_one_b"]
NUMBERS = ["0", "1", "2", "3", "8", "64", "1024", "7.5e9", "0.5", "1e999999", "1_000", "10e300", "12", "00",
           "3.0", "1e-9", "99999999999999999999999"]
STRINGS = ['"x"', '""', '"a label: <= 8 GB"', '"#not a comment"', '"config.json"', '"ψ ünïcode"']


class Derivation:
    """Random sentences of the grammar: at depth past ``soft`` the expansion with the fewest
    rule symbols is taken, so every derivation ends."""

    def __init__(self, rng: random.Random, soft: int = 7):
        parser = build_parser(cache=False)
        self.rules: dict[str, list[list]] = {}
        for r in parser.rules:
            self.rules.setdefault(r.origin.name, []).append(list(r.expansion))
        self.terminals = {t.name: t.pattern for t in parser.terminals}
        self.rng, self.soft = rng, soft

    def terminal(self, name: str) -> str:
        pattern = self.terminals[name]
        if pattern.type == "str":
            return pattern.value
        pick = {"NAME": NAMES, "NUMBER": NUMBERS, "STRING": STRINGS, "COMP_OP": ["==", "!=", "<=", ">=", "<", ">"],
                "UNIT": ["B", "GB", "GiB", "KB", "TiB"]}.get(name)
        if pick is None:
            raise KeyError(name)
        return self.rng.choice(pick)

    def sentence(self, symbol: str = "start") -> str:
        out: list[str] = []
        stack: list[tuple[str, int]] = [(symbol, 0)]
        while stack:
            name, depth = stack.pop()
            if name not in self.rules:
                out.append(self.terminal(name))
                if self.rng.random() < 0.03:
                    out.append(f"\n# c{len(out)}\n")
                continue
            options = self.rules[name]
            if depth > self.soft:
                options = [min(options, key=lambda e: sum(1 for s in e if s.name in self.rules))]
            for s in reversed(self.rng.choice(options)):
                stack.append((s.name, depth + 1))
            if len(out) > 400:
                break
        text = ""
        for tok in out:
            sep = "\n" if tok.startswith("\n") or self.rng.random() < 0.15 else " "
            text += tok if tok.startswith("\n") else sep + tok
        return text.strip() + "\n"


# --------------------------------------------------------------------------- mutations

HOSTILE_NUMBERS = ["0", "-1", "0.5", "1/3", "1e999999", "10^300", "2^2^2^2^2", "1/0", "0.0", "-0", "1e-999"]


def mutate(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(11)
        i = rng.randrange(len(lines)) if lines else 0
        if kind == 0 and lines:
            del lines[i]
        elif kind == 1 and lines:
            lines.insert(i, lines[i])
        elif kind == 2 and len(lines) > 1:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == 3 and lines:
            lines[i] = re.sub(r"\b\d[\d_.eE]*\b", lambda m: rng.choice(HOSTILE_NUMBERS), lines[i], count=1)
        elif kind == 4 and lines:
            lines[i] = re.sub(r"\b[A-Za-z_]\w*\b", lambda m: rng.choice(NAMES), lines[i], count=1)
        elif kind == 5 and lines:
            lines[i] = lines[i].replace("}", "", 1) if "}" in lines[i] else lines[i].replace("{", "", 1)
        elif kind == 6:
            lines.insert(i, f"  # inserted comment {i}")
        elif kind == 7 and lines:
            lines[i] = lines[i] + f"  # trailing {i}"
        elif kind == 8 and lines:
            cut = rng.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:cut]
        elif kind == 9 and lines:
            lines[i] = lines[i][:rng.randrange(len(lines[i]) + 1)] + rng.choice(["{", "}", "(", ":", "=", "\"", "*"])
        else:
            lines = lines[: rng.randrange(len(lines) + 1)]
    out = "\n".join(lines)
    ending = rng.random()
    if ending < 0.08:
        out = out.replace("\n", "\r")
    elif ending < 0.16:
        out = out.replace("\n", "\r\n")
    if rng.random() < 0.05:
        out = "\ufeff" + out
    return out


# --------------------------------------------------------------------------- the fmt contract


def _comments(text: str) -> Counter:
    """The comments of a spec (outside string literals), each as its text after '#'."""
    text = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    found: Counter = Counter()
    in_string = False
    i = 0
    while i < len(text):
        ch = text[i]
        if in_string:
            in_string = ch not in '"\n'
        elif ch == '"':
            in_string = True
        elif ch == "#":
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            found[text[i + 1:end].strip()] += 1
            i = end
            continue
        i += 1
    return found


def fmt_contract(source: str, formatted: str) -> list[str]:
    """What is wrong with ``formatted`` as the canonical form of ``source`` (empty: nothing)."""
    problems = []
    try:
        again = format_source(formatted, "<formatted>")
    except DiagnosticError as exc:
        return [f"fmt output does not parse: {exc.diagnostics[0].message}"]
    if again != formatted:
        problems.append("fmt is not idempotent")
    normal = source.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    if parse(formatted, "<f>") != parse(normal, "<s>"):
        problems.append("fmt changed the code")
    lost = _comments(source) - _comments(formatted)
    if lost:
        problems.append(f"fmt dropped comments: {sorted(lost)[:3]}")
    return problems


# --------------------------------------------------------------------------- cases


def hostile_cases(tmp: Path) -> list[tuple[list[str], str | None, set[int]]]:
    """(argv, stdin, allowed exit statuses) for hostile flags and files."""
    good = "examples/zero_paper.place"
    fifo = tmp / "fifo.place"
    if hasattr(os, "mkfifo"):
        os.mkfifo(fifo)
    else:  # no FIFOs here: a missing file stands in
        fifo = tmp / "no_fifo.place"
    (tmp / "zero.place").symlink_to("/dev/zero" if Path("/dev/zero").exists() else tmp / "missing")
    (tmp / "folder.place").mkdir()
    for name, body in (("imports_fifo", "from fifo import x\n"), ("imports_zero", "from zero import x\n"),
                       ("model_fifo", 'model from "fifo.place" {\n}\n'),
                       ("model_zero", 'model from "zero.place" {\n}\n')):
        (tmp / f"{name}.place").write_text(body)
    cases: list[tuple[list[str], str | None, set[int]]] = []
    for t in ("nan", "inf", "-inf", "0", "-1", "1e300", "abc", "", "1/0", "0.0", "1e-400"):
        cases.append((["prove", "--only", "none", "--timeout", t], None, {2}))
        cases.append((["check", good, "--timeout", t], None, {2}))
    for s in ("dp=0", "dp=-1", "dp=0.5", "dp=1/0", "dp=nan", "dp=inf", "psi=", "=3", "dp", "nope=3", "psi=abc",
              "dp=1e999999999", "psi=1e999999999", "psi=-1e999999999", "psi=1/1e999999999"):
        cases.append((["cost", good, "--set", s], None, {2}))
    for s in ("dp=1000000", "dp=1", "psi=1", "psi=1e300", "dp=99999999999999999999", "psi=1/3"):
        cases.append((["cost", good, "--set", s, "--format", "json"], None, {0, 1, 2, 3}))
        cases.append((["check", good, "--set", s, "--timeout", "2"], None, {0, 1, 2, 3}))
    for w in ("0", "-5", "39", "abc", "1e3"):
        cases.append((["cost", good, "--width", w], None, {2}))
    cases.append((["cost", good, "--width", "100000"], None, {0}))
    for f in ("/dev/zero", "/dev/null", str(fifo), str(tmp / "folder.place"), str(tmp / "missing.place"), "",
              str(tmp / "zero.place")):
        for command in ("cost", "compare", "check", "inspect", "fmt"):
            cases.append(([command, f], None, {2} if f != "/dev/null" else {0, 2}))
    for name in ("imports_fifo", "imports_zero", "model_fifo", "model_zero"):
        for command in ("cost", "inspect", "check"):
            cases.append(([command, str(tmp / f"{name}.place")], None, {2}))
    for flags in (["--devices", "1000000"], ["--devices", "0"], ["--devices", "-3"], ["--steps", "0"],
                  ["--steps", "1000000"], ["--devices", "abc"]):
        cases.append((["measure", "examples/library/zero3.place", "--plan", "zero3", *flags], None, {2}))
    model = "examples/models/llama3_8b.place"
    base = ["--device", "h100_sxm", "--devices", "8", "--global-batch", "8", "--seq", "1024"]
    for i in range(0, len(base), 2):
        for bad in ("0", "-3", "abc", "1e9", "", "nan"):
            flags = list(base)
            flags[i + 1] = bad
            cases.append((["search", model, *flags], None, {2}))
    for flag in ("--tp", "--pp", "--microbatch", "--chunks", "--cp"):
        for bad in ("0", "8..1", "1..1000", "a,b", ",", "1..", "-1"):
            cases.append((["search", model, *base, flag, bad], None, {2}))
    for flag, bad in (("--strategies", "zero9"), ("--recompute", "some"), ("--schedules", "zb"), ("--mfu", "0"),
                      ("--mfu", "1.5"), ("--mfu", "x"), ("--top", "0"), ("--emit", "0"), ("--emit", "100000")):
        cases.append((["search", model, *base, flag, bad], None, {2}))
    for f in ("/dev/zero", str(fifo), str(tmp / "missing.place"), str(tmp / "folder.place"), good):
        cases.append((["search", f, *base, "--no-check", "--top", "1"], None, {2}))
    cases.append((["cost", good, "--device", "h100"], None, {2}))
    cases += config_cases(tmp)
    cases += [
        (["cost", good, "--plan", "nope"], None, {2}),
        (["compare", good, "--baseline", "nope"], None, {2}),
        (["cost", good, "--format", "bogus"], None, {2}),
        (["cost", good, "-o", str(tmp / "no" / "such" / "dir" / "x")], None, {2}),
        (["cost", "-"], (ROOT / good).read_text(), {0}),
        (["check", "-", "--timeout", "2"], "plan p {\n", {2}),
        (["fmt", "-"], "\x00\x01\x02 {{{", {2}),
        (["cost", good, "--latex-fragment"], None, {0}),
        (["nosuchcommand"], None, {2}),
        ([], None, {2}),
    ]
    return cases


HOSTILE_VALUES = ("3.0", "-5", "0", '"cpu"', "true", "null", "[]", "{}", '"auto"', "9" * 4001, "1e999", '"x" ',
                  "[" * 200 + "]" * 200)


def _json_mutations(text: str, rng: random.Random, n: int) -> list[str]:
    """``n`` mutations of a JSON document: a value replaced by a hostile one, a key dropped, the
    text truncated, the whole document nested deep."""
    spots = [m for m in re.finditer(r'(:\s*)("[^"]*"|-?\d[\d.eE+-]*|true|false|null|\{|\[)', text)]
    out = []
    for _ in range(n):
        kind = rng.randrange(4)
        if kind == 0 and spots:
            m = rng.choice(spots)
            out.append(text[:m.start(2)] + rng.choice(HOSTILE_VALUES) + text[m.end(2):])
        elif kind == 1:
            lines = text.splitlines()
            del lines[rng.randrange(len(lines))]
            out.append("\n".join(lines))
        elif kind == 2:
            out.append(text[:rng.randrange(len(text))])
        else:
            out.append("[" * 100_000 + text + "]" * 100_000)
    return out


def _line_mutations(text: str, rng: random.Random, n: int, values: tuple[str, ...]) -> list[str]:
    """``n`` mutations of a line-based file (TOML, arguments): a number or word replaced."""
    spots = list(re.finditer(r"(?<=[= ])[^\s=]+", text))
    out = []
    for _ in range(n):
        m = rng.choice(spots)
        out.append(text[:m.start()] + rng.choice(values) + text[m.end():])
    return out


def config_cases(tmp: Path) -> list[tuple[list[str], str | None, set[int]]]:
    """Every importer and ``lift`` on mutations of the shipped configurations and traces: a
    located diagnostic (2) or an answer (0, 1, 3), never a traceback or the internal-error status."""
    rng = random.Random(5)
    folder = tmp / "configs"
    folder.mkdir()
    cases = []
    devices = ["--devices", "8"]

    def add(kind: str, texts: list[str], suffix: str, extra: list[str], allowed: set[int]) -> None:
        for i, t in enumerate(texts):
            f = folder / f"{kind}{len(cases)}_{i}{suffix}"
            f.write_text(t)
            argv = ["lift", str(f)] if kind == "lift" else ["import", kind, str(f), *extra]
            cases.append((argv, None, allowed))

    hf = ROOT / "tests" / "data" / "hf"
    for src in (hf / "llama3_8b.json", hf / "mixtral_8x7b.json", hf / "deepseek_v3.json"):
        add("hf", _json_mutations(src.read_text(), rng, 6), ".json", [], {0, 2})
    frameworks = ROOT / "tests" / "data" / "frameworks"
    for src in (frameworks / "ds_zero1.json", frameworks / "ds_zero3_offload.json", ROOT / "examples" / "configs" /
                "ds_zero3.json"):
        add("deepspeed", _json_mutations(src.read_text(), rng, 6), ".json", devices + ["--params", "7000000000"],
            {0, 1, 2})
    titan = (frameworks / "torchtitan_llama3_8b.toml").read_text()
    add("torchtitan", _line_mutations(titan, rng, 10, ("5", "0", "-1", '"x"', "[]", "{}", "true", "3.5",
                                                       "9" * 4001, "[[[[")), ".toml",
        devices + ["--params", "7000000000"], {0, 1, 2})
    for src in (frameworks / "megatron_llama70b.args", ROOT / "examples" / "configs" / "megatron_llama3_8b.args"):
        add("megatron", _line_mutations(src.read_text(), rng, 8, ("0", "-1", "abc", "'x", "9" * 4001, "1e9",
                                                                 "--tensor-model-paralel-size")), ".args",
            ["--devices", "64"], {0, 1, 2})
    trace = (ROOT / "tests" / "data" / "traces" / "ddp_summed.json").read_text()
    add("lift", _json_mutations(trace, rng, 10), ".json", [], {0, 1, 2})
    return cases


def text_cases(seed: int) -> list[tuple[str, str]]:
    """(origin, spec text): grammar derivations and example mutations, interleaved."""
    rng = random.Random(seed)
    gen = Derivation(rng)
    examples = [(p.relative_to(ROOT), p.read_text()) for p in EXAMPLES]
    out = []
    for i in range(4000):
        if i % 2:
            out.append((f"grammar #{i}", gen.sentence()))
        else:
            name, text = examples[(i // 2) % len(examples)]
            out.append((f"mutation #{i} of {name}", mutate(text, rng)))
    return out


def commands_for(i: int, path: str) -> list[list[str]]:
    cmds = [["fmt", path], ["inspect", path]]
    if i % 3 == 0:
        cmds.append(["cost", path, "--format", "json"])
    if i % 7 == 0:
        cmds.append(["compare", path, "--format", "markdown"])
    if i % 11 == 0:
        cmds.append(["check", path, "--timeout", "2", "--format", "json"])
    return cmds


# --------------------------------------------------------------------------- the test


def judge(argv: list[str], answer: dict | None, allowed: set[int]) -> list[str]:
    if answer is None:
        return [f"no answer within {CASE_SECONDS:.0f} s (a hang)"]
    if answer["traceback"]:
        return ["traceback:\n" + answer["traceback"][-1500:]]
    problems = []
    if "Traceback (most recent call last)" in answer["err"] + answer["out"]:
        problems.append("a traceback was printed")
    code = answer["code"]
    if code not in allowed:
        problems.append(f"exit status {code}, expected one of {sorted(allowed)}")
    if code == 2 and argv and argv[0] in EXITS and not re.search(r"error: |\[PL\d{3}\]", answer["err"]):
        problems.append("exit status 2 without a diagnostic on stderr")
    if "--format" in argv and argv[argv.index("--format") + 1] == "json" and answer["out"]:
        try:
            doc = json.loads(answer["out"])
        except ValueError:
            return problems + ["--format json printed invalid JSON"]
        name = "diagnostics" if code == 2 else SCHEMA[argv[0]]
        found = schema_errors(doc, json.loads((ROOT / "docs" / "schema" / f"{name}.schema.json").read_text()))
        if found:
            problems.append("JSON does not fit its schema: " + "; ".join(found[:3]))
    return problems


@pytest.mark.slow
def test_fuzz_every_command(tmp_path):
    workers = [Worker() for _ in range(WORKERS)]
    lock = threading.Lock()
    failures: list[str] = []
    stats: Counter = Counter()

    def record(origin: str, argv: list[str], problems: list[str], text: str | None = None) -> None:
        with lock:
            stats["problems"] += bool(problems)
            if problems and len(failures) < 25:
                where = ""
                if text is not None:
                    keep = tmp_path / "failures" / f"case{len(failures)}.place"
                    keep.parent.mkdir(exist_ok=True)
                    keep.write_text(text)
                    where = f" (spec kept as {keep})"
                failures.append(f"{origin}: placement {' '.join(argv)}{where}: " + " | ".join(problems))

    def run(w: int, argv: list[str], stdin: str | None) -> dict | None:
        answer = workers[w].ask(argv, stdin)
        if answer is None:
            workers[w] = Worker()
        with lock:
            stats["commands"] += 1
        return answer

    hostile = hostile_cases(tmp_path)
    texts = text_cases(seed=int(os.environ.get("PLACEMENT_FUZZ_SEED", "11")))

    def lane(w: int) -> None:
        for argv, stdin, allowed in hostile[w::WORKERS]:
            record("hostile", argv, judge(argv, run(w, argv, stdin), allowed))
        deadline = time.monotonic() + BUDGET  # the generated specs' budget starts once the hostile lines ran
        for i in range(w, len(texts), WORKERS):
            if time.monotonic() > deadline:
                return
            origin, text = texts[i]
            path = tmp_path / f"w{w}" / "spec.place"
            path.parent.mkdir(exist_ok=True)
            path.write_text(text, newline="")
            with lock:
                stats["specs"] += 1
            for argv in commands_for(i, str(path)):
                answer = run(w, argv, None)
                problems = judge(argv, answer, EXITS[argv[0]])
                if not problems and argv[0] == "fmt" and answer["code"] == 0:
                    problems = fmt_contract(text, answer["out"])
                record(origin, argv, problems, text if problems else None)

    threads = [threading.Thread(target=lane, args=(w,)) for w in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in workers:
        w.close()
    print(f"fuzz: {stats['specs']} specs, {stats['commands']} commands, {len(hostile)} hostile command lines, "
          f"{stats['problems']} with problems")
    assert not failures, "\n".join(failures)
    assert stats["specs"] >= 200, f"only {stats['specs']} specs ran in {BUDGET} s"


def test_the_fmt_contract_sees_what_it_guards():
    src = 'let a = 1  # size\nclaim "#x": a == 1\n'
    assert fmt_contract(src, format_source(src, "<s>")) == []
    assert any("dropped comments" in p for p in fmt_contract(src, 'let a = 1\n\nclaim "#x": a == 1\n'))
    assert any("changed the code" in p for p in fmt_contract(src, "let a = 2  # size\n"))
    assert _comments('claim "# not one": a == 1 # one\r# two') == Counter({"one": 1, "two": 1})
