"""The README and docs/ stay true: small, generated pages current, every number bound to a value in a file.

Rules (what a failure here means):

- README.md is at most ``README_LIMIT`` bytes; the rest belongs in docs/.
- Generated pages equal what their generator writes now: docs/configuration.md and the
  ``<!-- params:NAME:begin/end -->`` tables of docs/algorithms/ (``python -m clusterfed.reference
  --write``), docs/results.md, docs/fidelity.md, docs/scale.md and README.md's ``results-summary`` block
  (``python benchmarks/report.py``). Fix: run the generator and commit what it writes.
- Every measured number in README.md and docs/**/*.md is generated or bound. Generated: inside
  a ``<!-- NAME:begin -->`` … ``<!-- NAME:end -->`` block or on a generated page (their own test
  above keeps them current). Bound: the number is followed (after its unit, if any) by
  ``<!-- bind: benchmarks/results/<file> <key> -->``, optionally `` *100`` (a fraction shown as a
  percentage) or `` /60`` (seconds shown as minutes; any ``*N`` or ``/N``). The test reads the file,
  follows the key, and the shown number must equal the value rounded to the shown decimals, sign
  included (− or -); a missing file, key or row fails. Addressing: JSON and TOML by dotted keys,
  list indices as integers (``rows.3.ari``; a key that itself holds dots, ``0.5``, is matched
  whole, longest first); JSONL as a list of its lines (``rounds.jsonl 0.round_seconds``); a
  string value that is a number and a unit (``"1.58 GB"``) reads as its number; CSV by ``<row>.<column>`` where ``<row>`` is a 0-based data-row index or
  ``col=value`` conditions joined by ``&`` that select exactly one row
  (``lambda.csv lambda=0.5&seed=0.ari``). Markdown tables and prose write-ups are not sources.
  A measured number is: a decimal (0.873, 12.5); any number with a unit of measure — percent
  (61 %, percent), points (3.1 pp), a duration (194.7 s, 40 min, 3 ms, 2 h, 12 seconds), a size
  (1.58 GB, 512 MiB, kB, bytes), a factor (72.6×, 3x); an integer beside ± (38 ± 5.7); and both ends of a range with a unit
  (2–9 min). Not measured, not checked: bare integers (counts, rounds, seeds, years), numbers in
  code spans and fenced blocks (parameters and their defaults belong there: `hicfl-tau = 0.45`),
  link targets, HTML comments, dotted versions (2.9.1), a number after a software name or
  "version" (Python 3.11, Flower 1.41), after a section/figure/equation word (Section 4.2, Eq. 3),
  after ``=``, ``≥``, ``≤``, ``<``, ``>`` (a threshold or a setting: ARI ≥ 0.9, ε = 0.25) and
  dimensions (8×8). A duration, size or percentage in a fenced block's comment fails: no marker can
  sit there, so say it in prose, bound.
  A count beside a bound number is measured too. In a segment that carries a bound number — a
  table row (one line starting with ``|``), or a sentence (a paragraph's lines joined, cut after
  ``.``, ``!`` or ``?`` before a capital, ``(``, ``*`` or a code span; a heading is a segment of its
  own and a list item starts a new paragraph) — an integer must be bound when it is (a) a table cell of numbers and
  punctuation only (the 5 of ``| fedclust | 5 | 0.944 <!-- bind: … --> |``, the 20 of
  ``0.888 <!-- bind: … --> (20)``), or (b) a count of what a run produced: followed by clusters,
  pre-clusters, splits, merges, packages, transmissions, times, rejections, failures, errors,
  retries or restarts (each of "16 and 9 clusters"). Still exempt there: settings and labels in
  words (400 clients, 30 rounds, 5 groups, seeds 0-2, round 3, 6 devices), ordinals, and every
  integer of a segment without a bound number.
  Fix: bind the number to the result file it comes from, write it into a summary.json beside its
  CSV/MD table (from data already in the repository), generate it, or drop it.
- Relative links resolve (file, and heading anchor in a Markdown file); no ``../shared``
  paths and no issue numbers.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 15_000
GENERATED_PAGES = ("docs/configuration.md", "docs/results.md", "docs/fidelity.md", "docs/scale.md")
MARKER_BLOCK = re.compile(r"<!-- ([\w:-]+):begin -->\n.*?<!-- \1:end -->", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def load_report():
    spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- size and generated pages

def test_readme_fits_on_a_screen():
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md is {size} bytes (limit {README_LIMIT}): move detail into docs/"


def test_generated_reference_pages_are_current():
    from clusterfed import reference

    assert (ROOT / "docs" / "configuration.md").read_text() == reference.markdown(), \
        "docs/configuration.md is stale: python -m clusterfed.reference --write"
    stale = [p.relative_to(ROOT).as_posix() for p, text in reference.algorithm_pages().items() if p.read_text() != text]
    assert not stale, f"parameter tables stale in {stale}: python -m clusterfed.reference --write"
    for path in (ROOT / "docs" / "algorithms").glob("*.md"):
        assert "<!-- params:" in path.read_text(), f"{path.name} has no generated parameter table"
    from clusterfed.strategies import REGISTRY, clustered_classes

    # a strategy's reference entry is generated from its class (a hand page is optional);
    # a hand page's table names a registered strategy
    configuration = (ROOT / "docs" / "configuration.md").read_text()
    missing = [name for name in clustered_classes() if f"## `{name}` — " not in configuration]
    assert not missing, f"registered strategies without an entry in docs/configuration.md: {missing}"
    documented = "".join(p.read_text() for p in (ROOT / "docs" / "algorithms").glob("*.md"))
    unregistered = [name for name in re.findall(r"<!-- params:([\w-]+):begin -->", documented) if name not in REGISTRY]
    assert not unregistered, f"parameter tables of strategies that are not registered: {unregistered}"


def test_generated_result_pages_are_current():
    report = load_report()
    stale = [p.relative_to(ROOT).as_posix() for p, text in report.generated().items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"stale: {stale}; run python benchmarks/report.py"


# ---------------------------------------------------------------- numbers

BIND_PREFIX = "benchmarks/results/"
UNIT = (r"(?:%|pp\b|ms\b|s\b|min\b|h\b|[kKMGT]i?B\b|bytes\b|×(?!\s?\d)|(?<=\d)x\b|"
        r"(?:milli)?seconds?\b|minutes?\b|hours?\b|percent\b)")
NUM = r"\d{1,3}(?:,\d{3})+(?![\d.])|\d+(?:\.\d+)?"
SIGNED = rf"(?:(?<![\w.)])[-−+])?(?<![\w.])(?:{NUM})"
BIND = re.compile(
    rf"(?P<num>{SIGNED})(?P<unit>\s?{UNIT})?(?:\*\*|`)?\s*"
    r"<!-- bind: (?P<path>\S+) (?P<key>\S+?)(?: (?P<op>[*/])(?P<factor>\d+(?:\.\d+)?))? -->")
QUANTITY = re.compile(r"(-?\d+(?:\.\d+)?)(?:\s?[A-Za-z%]+)?")  # "1.58 GB" in a result file reads 1.58
HTML_COMMENT = re.compile(r"<!--.*?-->", re.S)
CANDIDATE = re.compile(
    rf"(?<![\w./@#§])(?<![A-Za-z_]-)(?P<num>{NUM})(?![\w.]*\d)"
    rf"(?P<after>\s?(?:±|{UNIT}|[–-]\s?(?:{NUM})\s?{UNIT}))?")
EXEMPT_BEFORE = re.compile(
    r"(?:\b(?:Python|Flower|flwr|torch|torchvision|PyTorch|Ray|podman|Podman|Docker|Compose|podman-compose|Debian|CUDA|"
    r"Pi|OS|version|release|v|Section|Sec\.|§|Eq\.|Equation|Algorithm|Alg\.|Fig\.|Figure|Table|Theorem|Lemma|"
    r"step|Step|line)|[=≥≤<>]|>=|<=)\s*~?\s*$")


def strip_generated(text: str) -> str:
    return MARKER_BLOCK.sub("", text)


def value_at(source: Path, key: str) -> float:
    """The number at ``key`` in a result file (see the module docstring for the addressing);
    KeyError/ValueError say what is missing."""
    if source.suffix == ".csv":
        selector, _, column = key.rpartition(".")
        with source.open(newline="") as f:
            rows = list(csv.DictReader(f))
        if selector.isdigit():
            chosen = [rows[int(selector)]] if int(selector) < len(rows) else []
        else:
            tests = [part.partition("=") for part in selector.split("&")]
            chosen = [r for r in rows if all(r.get(c) == v for c, _, v in tests)]
        if len(chosen) != 1:
            raise KeyError(f"{len(chosen)} rows of {source.name} match {selector!r} (need exactly one)")
        if column not in chosen[0]:
            raise KeyError(f"no column {column!r} in {source.name}")
        return float(chosen[0][column])
    if source.suffix == ".json":
        node: Any = json.loads(source.read_text())
    elif source.suffix == ".jsonl":
        node = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    elif source.suffix == ".toml":
        node = tomllib.loads(source.read_text())
    else:
        raise ValueError(f"{source.name}: a bound value lives in a .json, .jsonl, .csv or .toml file, not {source.suffix!r}")
    parts = key.split(".")
    while parts:
        if isinstance(node, list):
            index = parts.pop(0)
            if not index.lstrip("-").isdigit() or not -len(node) <= int(index) < len(node):
                raise KeyError(f"index {index!r} not in a list of {len(node)}")
            node = node[int(index)]
            continue
        if not isinstance(node, dict):
            raise KeyError(f"{'.'.join(parts)!r} under a {type(node).__name__}")
        for n in range(len(parts), 0, -1):  # the longest match first: a key may hold dots ("0.5")
            if ".".join(parts[:n]) in node:
                node, parts = node[".".join(parts[:n])], parts[n:]
                break
        else:
            raise KeyError(f"no key {parts[0]!r} (keys: {sorted(node)[:12]})")
    if isinstance(node, str) and (quantity := QUANTITY.fullmatch(node.strip())):
        return float(quantity.group(1))
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ValueError(f"{key!r} is {node!r}, not a number")
    return float(node)


def shown_value(text: str) -> tuple[float, int]:
    """A number as a page writes it: its value (sign included, − or -) and its decimals."""
    text = text.replace("−", "-").replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return float(text), decimals


def bind_problem(match: re.Match, root: Path = None) -> str | None:
    """Why a ``<!-- bind: -->`` marker's number is wrong, or None when it equals the file's value
    rounded to the shown decimals."""
    root = root or ROOT
    path, key = match.group("path"), match.group("key")
    if not path.startswith(BIND_PREFIX):
        return f"{path}: a bound number comes from a file under {BIND_PREFIX}"
    source = root / path
    if not source.is_file():
        return f"{path}: no such file"
    try:
        value = value_at(source, key)
    except (KeyError, ValueError, IndexError, json.JSONDecodeError, tomllib.TOMLDecodeError) as error:
        return f"{path} {key}: {error}"
    if match.group("op"):
        factor = float(match.group("factor"))
        value = value * factor if match.group("op") == "*" else value / factor
    shown, decimals = shown_value(match.group("num"))
    if abs(shown - value) > 0.5 * 10 ** -decimals + 1e-9 * max(1.0, abs(value)):
        return f"{match.group('num')} but {path} {key} is {value!r} (shown with {decimals} decimals: {value:.{decimals}f})"
    return None


def unbound_numbers(text: str) -> list[tuple[str, str]]:
    """(number, line) of every measured number in ``text`` (bound ones and bind markers already
    removed) outside code, link targets and HTML comments: the rule of the module docstring."""
    text = FENCE.sub("", text)
    text = CODE.sub("``", text)
    text = LINK.sub(lambda m: m.group(0).split("](")[0] + "]", text)
    text = HTML_COMMENT.sub("", text)
    found = []
    for line in text.split("\n"):
        for m in CANDIDATE.finditer(line):
            number, after = m.group("num"), m.group("after")
            if "." not in number and not after:
                continue  # a bare integer: a count, a round, a seed
            if EXEMPT_BEFORE.search(line[:m.start()]):
                continue
            found.append((m.group(0).strip(), line.strip()))
    return found


COUNT_NOUN = (r"(?:clusters?|pre-clusters?|splits?|merges?|packages?|transmissions?|times|rejections?|failures?|"
              r"errors?|retries|restarts?)\b")
INTEGER = r"\d{1,3}(?:,\d{3})+(?![\d.])|\d+(?![\d.])"
COUNT = re.compile(rf"(?<![\w./@#§⟨-])(?:{INTEGER})(?=(?:\s*(?:,|and|or|to|–)\s*(?:{INTEGER}))*\s+(?:of them\s+)?{COUNT_NOUN})")
CELL_OF_NUMBERS = re.compile(r"[\s\d,.()±–~/-]*\d[\s\d,.()±–~/-]*")
SENTENCE_END = re.compile(r"(?<=[.!?])[*_)\"']*\s+(?=[A-Z(*`\[])")
BOUND = "⟨bound⟩"


def segments(text: str) -> list[str]:
    """The table rows and sentences of ``text`` (code, link targets and HTML comments removed), for the
    count rule of the module docstring."""
    text = FENCE.sub("", text)
    text = CODE.sub("``", text)
    text = LINK.sub(lambda m: m.group(0).split("](")[0] + "]", text)
    text = HTML_COMMENT.sub("", text)
    out, paragraph = [], []

    def flush():
        if paragraph:
            out.extend(SENTENCE_END.split(" ".join(paragraph)))
            paragraph.clear()

    for line in (line.strip() for line in text.split("\n")):
        if not line or line.startswith(("|", "#")) or re.match(r"(?:[-*+]|\d+\.)\s", line):
            flush()
        if line.startswith(("|", "#")):
            out.append(line)
        elif line:
            paragraph.append(line)
    flush()
    return out


def unbound_counts(text: str) -> list[tuple[str, str]]:
    """(integer, segment) of every count beside a bound number (bound numbers already replaced by
    ``⟨bound⟩``) that is not bound itself: the count rule of the module docstring."""
    found = []
    for segment in segments(text):
        if BOUND not in segment:
            continue
        if segment.startswith("|"):
            for cell in segment.strip("|").split("|"):
                cell = cell.replace(BOUND, "")
                if CELL_OF_NUMBERS.fullmatch(cell):
                    found += [(m.group(0), segment) for m in re.finditer(rf"(?<![\d.,])(?:{INTEGER})", cell)]
        found += [(m.group(0), segment) for m in COUNT.finditer(segment)]
    return found


def fenced_measurements(text: str) -> list[str]:
    """Durations, sizes and percentages in the comments of fenced blocks (no marker can sit there)."""
    out = []
    for block in FENCE.findall(text):
        for line in block.split("\n")[1:-1]:
            comment = line.partition(" # ")[2] or (line.strip()[1:] if line.strip().startswith("#") else "")
            out += [f"{m.group(0)} (in: {line.strip()[:90]})" for m in CANDIDATE.finditer(comment)
                    if m.group("after") and m.group("after").strip()[:1] not in ("±", "×")]
    return out


def number_problems(text: str, root: Path = None) -> list[str]:
    """Every failure of the number rule on one page's text: wrong or dangling bind markers,
    measured numbers neither bound nor generated, measurements in code comments."""
    text = strip_generated(text)
    # a marker shown in a code block or span is an example, not a binding
    text = FENCE.sub(lambda m: m.group(0).replace("<!-- bind:", "<!-- bind (example):"), text)
    text = CODE.sub(lambda m: m.group(0).replace("<!-- bind:", "<!-- bind (example):"), text)
    problems = []

    def check(match: re.Match) -> str:
        problem = bind_problem(match, root)
        if problem:
            problems.append(f"wrong: {problem}")
        return "⟨bound⟩"

    rest = BIND.sub(check, text)
    problems += [f"a bind marker with no number right before it: {m.group(0)}"
                 for m in re.finditer(r"<!-- bind:.*?-->", rest, re.S)]
    problems += [f"unbound: {number} (in: {line[:110]})" for number, line in unbound_numbers(rest)]
    problems += [f"an unbound count beside a bound number: {number} (in: {segment[:110]})"
                 for number, segment in unbound_counts(rest)]
    problems += [f"in a code block (say it in prose, bound): {hit}" for hit in fenced_measurements(rest)]
    return problems


@pytest.mark.parametrize("page", [p for p in pages() if p.relative_to(ROOT).as_posix() not in GENERATED_PAGES],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_number_is_bound_to_a_result_file(page):
    problems = number_problems(page.read_text())
    assert not problems, (f"{page.relative_to(ROOT)}: numbers not traceable to one value in one result file; "
                          "bind each (`0.944 <!-- bind: benchmarks/results/<file>.json <key> -->`), "
                          "generate it, or drop it:\n  " + "\n  ".join(problems))


def test_the_number_rule_itself(tmp_path):
    """The rule catches a wrong bound number, an unbound measurement and a missing file or key,
    and lets a right one, its percentage, a sign and the exempt kinds of number through."""
    results = tmp_path / "benchmarks" / "results" / "x"
    results.mkdir(parents=True)
    (results / "summary.json").write_text(json.dumps(
        {"rows": [{"ari": 0.944, "clusters": 5}, {"ari": -0.0213}], "by": {"0.5": {"share": 0.6149}}, "wall_s": 194.7}))
    (results / "t.csv").write_text("lam,seed,ari\n0.5,0,0.8733\n0.5,1,0.91\n")
    page = "benchmarks/results/x/"
    right = (f"ARI 0.944 <!-- bind: {page}summary.json rows.0.ari --> and −0.02 <!-- bind: {page}summary.json rows.1.ari -->,"
             f" 61 % <!-- bind: {page}summary.json by.0.5.share *100 -->, about 3 min <!-- bind: {page}summary.json wall_s /60 -->,"
             f" 0.873 <!-- bind: {page}t.csv lam=0.5&seed=0.ari --> and 0.91 <!-- bind: {page}t.csv 1.ari -->.\n"
             "Not measured: 20 clients, seed 3, Python 3.11, torch 2.9.1, `lambda = 0.5`, ARI ≥ 0.9, ε = 0.25,"
             " Section 4.2, 8×8 images, 2026.\n<!-- x:begin -->\nARI 0.5 (generated)\n<!-- x:end -->\n")
    assert number_problems(right, tmp_path) == []
    for wrong in (f"ARI 0.95 <!-- bind: {page}summary.json rows.0.ari -->",       # 0.944 rounds to 0.94
                  f"ARI 0.02 <!-- bind: {page}summary.json rows.1.ari -->",       # the sign
                  f"61 % <!-- bind: {page}summary.json by.0.5.share -->",         # a fraction, not *100
                  f"0.944 <!-- bind: {page}summary.json rows.2.ari -->",          # no such index
                  f"0.944 <!-- bind: {page}missing.json rows.0.ari -->",          # no such file
                  f"0.873 <!-- bind: {page}t.csv lam=0.5.ari -->",                # two rows match
                  "0.944 <!-- bind: docs/other.json x -->",                       # not a result file
                  f"ARI <!-- bind: {page}summary.json rows.0.ari -->"):           # nothing to bind
        assert len(number_problems(wrong, tmp_path)) == 1, wrong
    unbound = ("HiCFL ended at 0.944, 45 % fewer rounds, 194.7 s, 2–9 min, 1.58 GB, 38 ± 5.7 rounds, 3.1 pp, 72.6× less,"
               " 12 seconds, 3x")
    assert [n for n, _ in unbound_numbers(unbound)] == \
        ["0.944", "45 %", "194.7 s", "2–9 min", "1.58 GB", "38 ±", "5.7", "3.1 pp", "72.6×", "12 seconds", "3x"]
    # a count beside a bound number: a table cell of numbers, or what a run produced
    ari = f"0.944 <!-- bind: {page}summary.json rows.0.ari -->"
    five = f"5 <!-- bind: {page}summary.json rows.0.clusters -->"
    assert number_problems(f"| fedclust | {five} | {ari} |\n| fedclust | {ari} ({five}) | – |\n"
                           f"At 400 clients in 5 groups (seeds 0-2, 30 rounds) FedClust formed {five} clusters,\n"
                           f"ARI {ari} from round 3 on 6 devices.\nFedClust formed 5 clusters (no bound number here).\n", tmp_path) == []
    for wrong, count in ((f"| fedclust | 5 | {ari} |", 1),                      # the loophole: the 5 unbound
                         (f"| fedclust | {ari} (5) | – |", 1),                  # beside it in its cell
                         (f"| 16 | 9 | {ari} |", 2),
                         (f"CFL ended at {ari}, still\n16 and 9 clusters for 5 groups.", 2),  # one sentence, two lines
                         (f"FedClust formed 4 clusters (ARI {ari}).", 1),
                         (f"It made 12 splits; ARI {ari}.", 1)):
        assert len(number_problems(wrong, tmp_path)) == count, (wrong, number_problems(wrong, tmp_path))
    assert number_problems(f"FedClust formed 4 clusters. Then ARI {ari}.", tmp_path) == []  # two sentences
    assert len(number_problems("```bash\nmake bench-quick   # about 2 min\n```\n", tmp_path)) == 1
    assert number_problems("```markdown\nARI 0.9 <!-- bind: benchmarks/results/y.json a -->\n```\n", tmp_path) == []


# ---------------------------------------------------------------- links and forbidden text

def slug(heading: str) -> str:
    text = heading.lstrip("#").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    text = FENCE.sub("", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md":
            headings = {slug(line) for line in FENCE.sub("", path.read_text()).split("\n") if re.match(r"#{1,6} ", line)}
            if anchor not in headings:
                broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links that do not resolve: {broken}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_shared_paths_or_issue_numbers(page):
    text = page.read_text()
    assert "../shared" not in text and "/work/shared" not in text, f"{page.name}: a path outside the repository"
    issues = re.findall(r"(?<![\w&/])#\d+\b|\bissue \d+|\bissues?/\d+|\bpull/\d+", text)
    assert not issues, f"{page.relative_to(ROOT)}: issue numbers {issues}"
