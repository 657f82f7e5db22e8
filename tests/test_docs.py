"""The README and docs/ stay true: small, generated pages current, every number traceable to a file.

Rules (what a failure here means):

- README.md is at most ``README_LIMIT`` bytes; the rest belongs in docs/.
- Generated pages equal what their generator writes now: docs/configuration.md and the
  ``<!-- params:NAME:begin/end -->`` tables of docs/algorithms/ (``python -m clusterfed.reference
  --write``), docs/results.md, docs/fidelity.md, docs/scale.md and README.md's ``results-summary`` block
  (``python benchmarks/report.py``). Fix: run the generator and commit what it writes.
- Every measured number in README.md and docs/**/*.md outside generated text — a decimal
  (0.873, 12.5), a percentage (61 %) or points (3.1 pp) — must occur in a file that its
  paragraph cites by path, or, when the paragraph cites none, its section (heading to next
  heading): a `benchmarks/results/...` file or folder, `benchmarks/RESULTS.md`, ..., in
  backticks or as a link; a folder stands for the files under it. The number is written as
  in the file; a fraction may be written as its percentage (0.61 reads 61 %), and in a file
  with few numbers (at most ``ROUNDED_MAX``) a number may be rounded to 3 or 4 decimals
  (0.8733 reads 0.873) — in a bigger file rounding would match anything. Not measurements,
  and not checked: integers, numbers in code (backticks, fenced blocks), dotted versions
  (2.9.1) and a version after a software name (Python 3.11).
  Fix: cite the file the number comes from in that paragraph, or drop the number.
- Relative links resolve (file, and heading anchor in a Markdown file); no ``../shared``
  paths and no issue numbers.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 15_000
GENERATED_PAGES = ("docs/configuration.md", "docs/results.md", "docs/fidelity.md", "docs/scale.md")
MARKER_BLOCK = re.compile(r"<!-- ([\w:-]+):begin -->\n.*?<!-- \1:end -->", re.S)
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
VERSION_WORDS = ("Python", "Flower", "flwr", "torch", "torchvision", "PyTorch", "Ray", "podman", "Podman",
                 "Compose", "podman-compose", "Debian", "CUDA", "Pi", "OS", "version", "release")
NUMBER = re.compile(
    r"(?<![\w.])(?P<num>\d+\.\d+|\d+)(?![\w.]*\d)(?:\s?(?P<unit>%|pp\b))?")
TEXT_SUFFIXES = {".md", ".json", ".jsonl", ".csv", ".txt", ".toml", ".py", ".log", ""}
MAX_FILE_BYTES = 5_000_000
ROUNDED_MAX = 300


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
    from clusterfed.strategies import REGISTRY

    documented = "".join(p.read_text() for p in (ROOT / "docs" / "algorithms").glob("*.md"))
    missing = [name for name in REGISTRY if f"<!-- params:{name}:begin -->" not in documented]
    assert not missing, f"registered strategies without a page under docs/algorithms/: {missing}"


def test_generated_result_pages_are_current():
    report = load_report()
    stale = [p.relative_to(ROOT).as_posix() for p, text in report.generated().items()
             if not p.exists() or p.read_text() != text]
    assert not stale, f"stale: {stale}; run python benchmarks/report.py"


# ---------------------------------------------------------------- numbers

def strip_generated(text: str) -> str:
    return MARKER_BLOCK.sub("", text)


def sections(text: str) -> list[tuple[str, str]]:
    """(heading, body) pairs; fenced blocks are kept whole so a '#' comment in one is no heading."""
    out, heading, body = [], "(top)", []
    in_fence = False
    for line in text.split("\n"):
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and re.match(r"#{1,6} ", line):
            out.append((heading, "\n".join(body)))
            heading, body = line, []
        else:
            body.append(line)
    out.append((heading, "\n".join(body)))
    return out


def paragraphs(section: str) -> list[str]:
    """Blocks between blank lines, a fenced block never split."""
    out, block, in_fence = [], [], False
    for line in section.split("\n"):
        if line.startswith("```"):
            in_fence = not in_fence
        if not line.strip() and not in_fence:
            if block:
                out.append("\n".join(block))
            block = []
        else:
            block.append(line)
    if block:
        out.append("\n".join(block))
    return out


def expand_braces(path: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", path)
    if not match:
        return [path]
    return [p for part in match.group(1).split(",")
            for p in expand_braces(path[:match.start()] + part + path[match.end():])]


def cited_files(section: str, page: Path) -> list[Path]:
    """Files a section names: code spans and link targets that resolve to repository paths."""
    candidates = CODE.findall(section) + [t.split("#")[0] for t in LINK.findall(section)]
    files: list[Path] = []
    for raw in candidates:
        for token in re.split(r"[\s,;()]+", raw):
            token = token.strip("`'\"").rstrip(".:")
            if not token or "/" not in token and not token.endswith((".md", ".json", ".csv")):
                continue
            for path in expand_braces(token):
                for base in (ROOT, page.parent):
                    hits = sorted(base.glob(path)) if "*" in path else [base / path]
                    for hit in hits:
                        hit = hit.resolve()
                        if hit.is_file():
                            files.append(hit)
                        elif hit.is_dir() and ROOT in hit.parents:
                            files += [f for f in sorted(hit.rglob("*")) if f.is_file()]
    return files


@functools.lru_cache(maxsize=None)
def file_numbers(path: Path) -> frozenset[str]:
    """Every number in a file as written, and a fraction as its exact percentage; in a file of at
    most ROUNDED_MAX distinct numbers also rounded to 3 or 4 decimals (a big file would match anything)."""
    if path.suffix not in TEXT_SUFFIXES or path.stat().st_size > MAX_FILE_BYTES:
        return frozenset()
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        return frozenset()
    tokens = set(re.findall(r"\d+(?:\.\d+)?(?:[eE]-?\d+)?", text))
    out = set(tokens) | {t + "%" for t in tokens}
    for token in tokens:
        value = float(token)
        for digits in range(5):
            percent = 100 * value
            if abs(percent - round(percent, digits)) < 1e-9:
                out.add(f"{percent:.{digits}f}%")  # 0.61 is 61 %, exactly
        if len(tokens) <= ROUNDED_MAX:
            out.update(f"{value:.{digits}f}" for digits in (3, 4))  # 0.8733 reads 0.873
    return frozenset(out)


def measured_numbers(section: str) -> list[tuple[str, str]]:
    """(number as checked, the line) of every decimal, percentage and pp value outside code."""
    text = FENCE.sub("", section)
    text = CODE.sub("", text)
    text = LINK.sub(lambda m: m.group(0).split("](")[0], text)
    found = []
    for line in text.split("\n"):
        for m in NUMBER.finditer(line):
            number, unit = m.group("num"), m.group("unit")
            if "." not in number and not unit:
                continue  # an integer: a count, a round, a seed
            before = line[:m.start()].rstrip()
            before = re.sub(r"[(\s]*(≥|>=|==|~)?\s*$", "", before)
            if before.endswith(VERSION_WORDS):
                continue
            found.append((number + ("%" if unit == "%" else ""), line.strip()))
    return found


def number_in(number: str, files: list[Path]) -> bool:
    return any(number in file_numbers(f) for f in files)


@pytest.mark.parametrize("page", [p for p in pages() if p.relative_to(ROOT).as_posix() not in GENERATED_PAGES],
                         ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_number_comes_from_a_cited_file(page):
    problems = []
    for heading, body in sections(strip_generated(page.read_text())):
        if not measured_numbers(body):
            continue
        section_files = cited_files(body, page)
        for paragraph in paragraphs(body):
            files = cited_files(paragraph, page) or section_files
            for number, line in measured_numbers(paragraph):
                if not number_in(number, files):
                    problems.append(f"{heading!r}: {number} (in: {line[:110]})")
    assert not problems, (f"{page.relative_to(ROOT)}: numbers no file cited in their paragraph (or, if it cites "
                          "none, their section) holds; cite the result file there, or drop the number:\n  "
                          + "\n  ".join(problems))


def test_the_number_rule_itself(tmp_path):
    assert [n for n, _ in measured_numbers("ARI 0.873 and 61 % and 3.1 pp, 20 clients, Python 3.11, torch 2.9.1, `0.5`")] \
        == ["0.873", "61%", "3.1"]
    result = tmp_path / "r.csv"
    result.write_text("a,b\n0.87333,0.61\n")
    assert number_in("0.873", [result]) and number_in("61%", [result]) and not number_in("0.874", [result])


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
