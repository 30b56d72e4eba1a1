"""The Chinese edition's message catalogues: complete, in sync with the English text, and faithful to it.

Every message of locale/zh_CN/LC_MESSAGES/**.po is translated and not fuzzy; a translation keeps
every inline code span, math span, link target and cross-reference target of its English source
(the text a reference shows may be translated: `{term}`注意力 <attention>`` keeps the target
`attention`; so may the words of a formula's `\\text{...}`: `$\\text{bytes}$` becomes
`$\\text{字节}$`); and the catalogues hold every message the English sources have today (`make
locale` refreshes them).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest
from babel.messages.pofile import read_po

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = ROOT / "locale" / "zh_CN" / "LC_MESSAGES"
CATALOGUES = sorted(MESSAGES.rglob("*.po"))

_ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")               # {term}`text <target>`, {cite}`key`, ...
_CODE = re.compile(r"(`+)(.+?)\1", re.S)                    # `code`, ``code with ` inside``
_DISPLAY_MATH = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE_MATH = re.compile(r"(?<![\\$])\$([^$\n]+?)\$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")                       # [text](target)
_MATH_TEXT = re.compile(r"\\text\{[^{}]*\}")                 # words inside a formula: translated
_TARGETED = {"term", "ref", "doc", "numref", "eq", "download", "py:func", "py:class", "py:meth", "py:mod",
             "py:attr", "py:obj", "func", "class", "meth", "mod", "attr", "obj"}


def _target(role: str, content: str) -> str:
    """What a role points at: the part in <...> for roles that may show other text, else all of it."""
    found = re.fullmatch(r"(?s).*<([^<>]+)>\s*", content) if role in _TARGETED else None
    target = (found.group(1) if found else content).strip()
    return target.lower() if role == "term" else target  # glossary terms are matched case-insensitively


def _formula(math: str) -> str:
    """A formula without the words of its `\\text{...}`, which a translation translates."""
    return _MATH_TEXT.sub(r"\\text{}", math)


def invariants(text: str) -> Counter:
    """The parts of a message a translation must keep: code spans, math, link and role targets."""
    parts: Counter = Counter()
    for role, content in _ROLE.findall(text):
        parts[f"{{{role}}} {_target(role, content)}"] += 1
    rest = _ROLE.sub(" ", text)
    parts.update(f"code {m.group(2)}" for m in _CODE.finditer(rest))
    rest = _CODE.sub(" ", rest)
    parts.update(f"math {_formula(m)}" for m in _DISPLAY_MATH.findall(rest))
    rest = _DISPLAY_MATH.sub(" ", rest)
    parts.update(f"math {_formula(m)}" for m in _INLINE_MATH.findall(rest))
    parts.update(f"link {m}" for m in _LINK.findall(rest))
    return parts


def _messages(path: Path):
    with path.open("rb") as f:
        return [m for m in read_po(f, locale="zh_CN") if m.id]


def _name(path: Path) -> str:
    return path.relative_to(MESSAGES).as_posix()


def test_there_is_a_catalogue_for_every_page():
    pages = {p.relative_to(ROOT).with_suffix("").as_posix() for p in
             [*ROOT.glob("*.md"), *(ROOT / "chapters").glob("*.ipynb")] if p.name != "README.md"}
    assert {_name(p)[:-3] for p in CATALOGUES} == pages


@pytest.mark.parametrize("path", CATALOGUES, ids=_name)
def test_every_message_is_translated_and_not_fuzzy(path):
    messages = _messages(path)
    untranslated = [m.id[:70] for m in messages if not m.string]
    fuzzy = [m.id[:70] for m in messages if m.fuzzy]
    assert not untranslated and not fuzzy, (f"{_name(path)}: {len(untranslated)} untranslated, {len(fuzzy)} "
                                            f"fuzzy of {len(messages)}; first: {(untranslated + fuzzy)[:3]}")


@pytest.mark.parametrize("path", CATALOGUES, ids=_name)
def test_a_numbered_title_stays_a_title(path):
    """A message is parsed as Markdown again: "16. 推理服务" would become a numbered list, and the heading's text would
    vanish from the page title and the navigation; the number's dot must be escaped ("16\\. ...")."""
    lists = [m.string[:40] for m in _messages(path) if m.string and re.match(r"\d+\. ", m.string)]
    assert not lists, f"{_name(path)}: translations that Markdown reads as a numbered list: {lists}"


@pytest.mark.parametrize("path", CATALOGUES, ids=_name)
def test_translations_keep_code_math_links_and_references(path):
    problems = []
    for m in _messages(path):
        if not m.string:
            continue
        source, translation = invariants(m.id), invariants(m.string)
        if source != translation:
            lost, added = source - translation, translation - source
            problems.append(f"{m.id[:60]!r}: lost {sorted(lost)}, added {sorted(added)}")
    assert not problems, f"{_name(path)}:\n  " + "\n  ".join(problems[:10])


@pytest.mark.parametrize("english, chinese, broken", [
    ("Call `attention(q, k, v)` now.", "现在调用 `attention(q, k, v)`。", False),
    ("Call `attention(q, k, v)` now.", "现在调用 attention(q, k, v)。", True),                # code dropped
    ("It is $\\sqrt{d_k}$.", "它是 $\\sqrt{d}$。", True),                                     # math altered
    ("See {term}`attention`.", "见{term}`注意力 <attention>`。", False),
    ("See {term}`Attention`.", "见{term}`注意力 <attention>`。", False),                       # case of a term
    ("See {term}`attention`.", "见{term}`注意力 <attention weights>`。", True),               # other target
    ("See {ref}`the cache <sec-cache>`.", "见{ref}`缓存 <sec-cache>`。", False),
    ("See {cite}`vaswani2017attention`.", "见文献。", True),                                  # citation dropped
    ("Read [the paper](https://arxiv.org/abs/1706.03762).", "读[论文](https://arxiv.org/abs/1706.03762)。", False),
    ("Read [the paper](https://arxiv.org/abs/1706.03762).", "读[论文](https://arxiv.org/)。", True),
    ("$$\nx = 1\n$$", "$$\nx = 1\n$$", False),
    ("$n \\cdot \\text{bytes}$ in all", "共 $n \\cdot \\text{字节}$", False),             # words in a formula
    ("$n \\cdot \\text{bytes}$ in all", "共 $m \\cdot \\text{字节}$", True),
])
def test_the_invariants_catch_what_a_translation_may_break(english, chinese, broken):
    assert (invariants(english) != invariants(chinese)) == broken


def test_catalogues_hold_every_message_of_the_english_sources(tmp_path):
    """The gettext builder extracts today's messages; each must be in its catalogue (else: make locale)."""
    sys.path.insert(0, str(ROOT / "_ext"))
    try:
        import zh_edition
    finally:
        sys.path.remove(str(ROOT / "_ext"))
    assert zh_edition.extract(tmp_path / "gettext") == 0, "the gettext build failed"
    missing = []
    for pot in sorted((tmp_path / "gettext").rglob("*.pot")):
        name = pot.relative_to(tmp_path / "gettext").with_suffix(".po")
        have = {m.id for m in _messages(MESSAGES / name)} if (MESSAGES / name).exists() else set()
        missing += [f"{name.as_posix()}: {m.id[:70]!r}" for m in _messages(pot) if m.id not in have]
    assert not missing, f"{len(missing)} messages of the English text are not in the catalogues (run " \
                        f"`make locale`, then translate them): " + "; ".join(missing[:5])
