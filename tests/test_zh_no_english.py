"""No English left on a page of the Chinese edition (_build/html/zh), outside code, math and outputs,
nor in the words of a formula (`\\text{...}`) of a Chinese catalogue.

The catalogue tests (test_zh_catalogues.py) prove that every message *in* a catalogue is
translated; this one reads what the reader sees, so it also catches text that reaches no catalogue
(exercise titles once did, and labels that extensions write, such as "Show code cell source").

What it reads: the visible text of every page (and its <title>), except code (`code`, `pre`,
API signatures and type lists), math, notebook cells' inputs and outputs, the bibliography's entries
and citation labels, the glossary's English term lines (each term is shown in English and in
Chinese on purpose) and the link to the English edition. Text in quotation marks is quoted data
(the English sentences a model reads, the strings a checker prints) and stays as it is; so does a
term glossed in parentheses after its Chinese name, 增量训练（uptraining）.

What it allows in the rest, as Chinese technical writing does: symbols (single letters),
identifiers (with a digit, `_` or `.`, followed by a call's parenthesis or `=`, or a name that the
page's code uses: not a word of a comment), acronyms and CamelCase names (GQA, RoPE, MiniLM, PyTorch), the capitalised names of
NAMES (people, models, products) and the lowercase terms of TERMS (softmax, logits, reshape, ...).

What it reports: any other Latin word, with its sentence: a leftover English sentence, title or
caption, a half-translated phrase, or an English grammar word (the, of, is, ...) anywhere. If it
reports a name or a term that Chinese text rightly keeps in English, add it to NAMES or TERMS.
"""

from __future__ import annotations

import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from babel.messages.pofile import read_po
from built_book import HTML, ROOT, ZH


def _cited_authors() -> set[str]:
    """The surnames of every author in references.bib: the people the prose may name (Ainslie 等人)."""
    bib = (ROOT / "references.bib").read_text(encoding="utf-8")
    names = set()
    for authors in re.findall(r"author\s*=\s*\{(.*)\},?\s*$", bib, re.M):
        for author in authors.split(" and "):
            surname = author.split(",")[0] if "," in author else author.split()[-1]
            names.update(re.findall(r"[A-Z][A-Za-z]+", re.sub(r"\{\\.\}|\\.", "", surname)))
    return names


# Capitalised words that are names: people (every author the book cites), models, products, projects.
NAMES = _cited_authors() | {
    "Adam", "Bahdanau", "Falcon", "Glorot", "Hugging", "Face", "Jupyter", "Kaiming", "Llama", "Meta",
    "Mistral", "Python", "Swish", "Toeplitz", "Transformer", "Transformers", "Triton", "Xavier",
    "Annotated", "Megatron", "fairseq",  # codebases whose style an interview answer borrows (chapter 10)
    "Pythia",  # a model family (chapter 12: where Xiao et al. found attention sinks)
    "Gemma",  # a model family (chapter 13: Gemma 2 alternates windowed and global layers)
    "Ulysses", "DeepSpeed",  # DeepSpeed-Ulysses (chapter 17; its authors are in references.bib)
    "Gated", "DeltaNet", "Kimi", "Linear",  # layer and model names: Gated DeltaNet, Kimi Linear (chapter 15)
    "Leviathan", "Chen", "Saxena", "Qiu", "Ye", "Peng", "Yu", "Orca", "Pearson",  # authors that attnlib's docstrings cite (API page)
    "Intel", "Xeon", "Hub",  # Intel's MKL (chapter 12), the Xeon the course map was timed on, the Hugging Face Hub
    "Scout",  # Llama 4 Scout, a model (chapter 14)
    "True", "False", "None",  # Python's constants, written as in code
    "Dh", "Dv",  # the book's dimension letters for the head width (DESIGN: B, H, H_kv, T, S, D, Dh)
    "attention-book",  # the book's author line
}
# Lowercase terms that Chinese technical writing keeps in English (words of code and of the field).
TERMS = {
    "softmax", "logits", "logit", "einsum", "reshape", "transpose", "permute", "expand", "view",
    "logsumexp", "log-sum-exp", "argmax", "tanh", "sigmoid", "dropout", "transformers", "torch",
    "attnlib", "nanoGPT", "eager", "sqrt", "exp", "log", "sin", "cos", "max", "min", "mean", "sum",
    "fan-in", "fan-out", "float", "int", "bool", "dtype", "id", "ids", "pos", "inf", "nan", "logistic",
    "matplotlib", "lm-head", "flash", "relu", "gelu", "vocab", "sentence-transformers", "lse", "epsilon",
    "top-k", "top-p",  # the sampling methods, named so in Chinese too (top-k 采样, top-p 采样)
    "gloo", "torchrun",  # torch.distributed's CPU backend and its launcher (chapter 17)
    "delta",  # the delta rule (delta 规则, chapter 15)
    "flash-linear-attention", "ring-flash-attention",  # codebases' names (chapters 15 and 17)
    "gpt-oss",  # OpenAI's open-weight model family, written in lowercase (chapter 14)
}
# English grammar words: one of them on a Chinese page is left-over English, whatever surrounds it.
FUNCTION_WORDS = {
    "a", "an", "the", "of", "to", "in", "on", "at", "by", "for", "from", "with", "without", "into",
    "and", "or", "but", "not", "no", "is", "are", "was", "were", "be", "been", "it", "its", "this",
    "that", "these", "those", "which", "what", "when", "where", "why", "how", "if", "then", "than",
    "as", "so", "each", "every", "all", "can", "cannot", "must", "may", "will", "has", "have", "do",
    "does", "you", "your", "we", "our", "they", "their", "there", "here", "only", "also", "yet",
}

_SKIP_TAGS = {"head", "script", "style", "template", "noscript", "svg", "math", "pre", "code", "kbd",
              "samp", "tt", "var"}
_SKIP_CLASSES = {
    "math",                       # MathJax source, inline and display
    "cell_input", "cell_output",  # a notebook cell's code and what it printed
    "highlight", "literal-block-wrapper",
    "sig",                        # an API signature
    "citation", "bibtex-citation",  # bibliography entries (authors and titles) and citation labels
    "edition-link",               # "English": the link to the other edition
    "modindex-jumpbox", "cap",    # the module index's letters
}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
         "track", "wbr"}
_BLOCK = {"p", "div", "section", "li", "dt", "dd", "td", "th", "h1", "h2", "h3", "h4", "h5", "h6",
          "figcaption", "caption", "title", "summary", "blockquote", "table", "tr", "ul", "ol", "dl",
          "article", "nav", "header", "footer", "main", "aside", "label", "button", "details"}


_NAME_SPANS = {"n", "nb", "nc", "nf", "nn", "nv", "na", "nx", "bp", "fm", "vm", "nd", "kc"}  # Pygments: names


class _Page(HTMLParser):
    """A page's visible prose, as blocks of text, and the identifiers of its code.

    The identifiers are the names in its code cells (not their comments or strings), its inline
    code, and its API signatures and parameter types: a word that is one of them is code in the prose.
    """

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[str] = []
        self.code: list[str] = []
        self._stack: list[tuple[str, set[str], bool, bool]] = []  # (tag, classes, skipped, identifiers)
        self._text: list[str] = []
        self._title = False
        self._glossary_last = ""  # the last term line or definition closed in a glossary

    def _top(self, i: int) -> bool:
        return bool(self._stack) and self._stack[-1][i]

    def _flush(self) -> None:
        text = re.sub(r"\s+", " ", "".join(self._text)).strip()
        if text:
            self.blocks.append(text)
        self._text = []

    def _in_glossary(self) -> bool:
        return bool(self._stack) and self._stack[-1][0] == "dl" and "glossary" in self._stack[-1][1]

    def _skip(self, tag: str, classes: set[str]) -> bool:
        if self._top(2) or tag in _SKIP_TAGS or classes & _SKIP_CLASSES:
            return True
        if tag == "dd" and classes & {"field-odd", "field-even"}:
            return True  # an API entry's parameters and their types
        return tag == "dt" and self._in_glossary() and self._glossary_last != "dt"  # a term's English line

    def handle_starttag(self, tag, attrs):
        if tag in _VOID:
            return
        classes = set((dict(attrs).get("class") or "").split())
        if tag in _BLOCK and not self._top(2):
            self._flush()
        skip = self._skip(tag, classes)
        names = self._top(3) or tag == "code" or "sig" in classes or (tag == "dd" and skip) or (
            tag == "span" and bool(classes & _NAME_SPANS))
        self._stack.append((tag, classes, skip, names))
        self._title = self._title or tag == "title"

    def handle_endtag(self, tag):
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                if tag in _BLOCK and not self._top(2):
                    self._flush()
                del self._stack[i:]
                break
        if tag in ("dt", "dd") and self._in_glossary():
            self._glossary_last = tag
        self._title = self._title and tag != "title"

    def handle_data(self, data):
        if self._title:
            self.blocks.append(data.strip())
        elif self._top(3):
            self.code.append(data)
        elif not self._top(2):
            self._text.append(data)

    def close(self) -> None:
        super().close()
        self._flush()


_QUOTED = re.compile(r"[“”\"][^“”\"]*[“”\"]|[‘’][^‘’]*[‘’]|「[^」]*」|『[^』]*』")  # smart quotes may face either way
# A term glossed at the end of a parenthesis, 增量训练（uptraining）, 称之为 memory）: one to three words
_GLOSS = re.compile(r"(?<=[（，、；\s])[A-Za-z]+(?:[ -][A-Za-z]+){0,2}(?=）)")
_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_'’+-]*(?:\.[A-Za-z0-9_]+)*")
_RUN_GAP = re.compile(r"^[ \u00a0]+$")  # words of one English phrase are separated by spaces only


def _unknown(word: str, before: str, after: str, identifiers: set[str]) -> bool:
    """Is `word` (a token without trailing punctuation) English that no rule allows?"""
    if word in NAMES or word.lower() in TERMS or word in identifiers:
        return False
    if len(word) == 1 or re.search(r"[0-9_.+]", word) or before in {".", "_", "-"} or after in {"(", "[", "_", "="}:
        return False  # a symbol, an identifier, a call or a keyword argument, a file extension
    if re.fullmatch(r"[A-Z]{2,}s?", word) or re.search(r".[A-Z]", word):
        return False  # an acronym (GQA, CPUs) or a CamelCase name (RoPE, MiniLM, PyTorch)
    if "-" in word or "'" in word or "’" in word:
        return any(_unknown(part, "", "", identifiers) for part in re.split(r"[-'’]", word) if part)
    return True


def english_left(blocks: list[str], code_words: set[str] = frozenset(), *, plain_identifiers: bool = False
                 ) -> list[str]:
    """The English words in these blocks of a Chinese page, each with its block (empty: none).

    `plain_identifiers`: the page writes identifiers as plain text (the API page: attnlib's docstrings
    are written for help()), so a lowercase word standing alone is taken for one; a grammar word, a
    capitalised word or two unknown words side by side are still English.
    """
    found = []
    for block in blocks:
        text = _GLOSS.sub(" ", _QUOTED.sub(" ", block))
        words = [(m, m.group().rstrip("'’-")) for m in _TOKEN.finditer(text)]
        grammar = [len(w) > 1 and w.lower() in FUNCTION_WORDS for _, w in words]
        unknown = [not g and _unknown(w, text[m.start() - 1:m.start()], text[m.end():m.end() + 1], code_words)
                   for (m, w), g in zip(words, grammar)]
        flagged = []
        for i, (m, word) in enumerate(words):
            if not (grammar[i] or unknown[i]):
                continue
            lone_lowercase = unknown[i] and word.islower() and not any(
                (grammar[j] or unknown[j]) and _RUN_GAP.match(text[min(m.end(), words[j][0].end()):
                                                                  max(m.start(), words[j][0].start())])
                for j in (i - 1, i + 1) if 0 <= j < len(words))
            if not (plain_identifiers and lone_lowercase):
                flagged.append(word)
        if flagged:
            found.append(f"{' '.join(dict.fromkeys(flagged))!r} in: {block[:160]}")
    return found


def read_page(html: str) -> tuple[list[str], set[str]]:
    """A page's visible prose blocks, and the identifiers in its code."""
    page = _Page()
    page.feed(html)
    page.close()
    return page.blocks, set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", " ".join(page.code)))


def _zh_pages() -> list[Path]:
    root = HTML / ZH
    return sorted(p for p in root.rglob("*.html")
                  if not {"_static", "_sources", "_images"} & set(p.relative_to(root).parts)
                  and p.name not in ("genindex.html",))  # the index lists terms and names, in English


def _zh_page_ids() -> list[str]:
    if not (HTML / ZH / "intro.html").exists():
        return ["(no Chinese edition built)"]
    return [p.relative_to(HTML / ZH).as_posix() for p in _zh_pages()]


@pytest.mark.parametrize("page", _zh_page_ids())
def test_no_english_is_left_on_a_chinese_page(page):
    path = HTML / ZH / page
    if not path.exists():
        if os.environ.get("ATTNBOOK_REQUIRE_BUILD") == "1":
            pytest.fail(f"{HTML / ZH} has no Chinese edition: build the book (make book) before this test")
        pytest.skip(f"no Chinese edition in {HTML / ZH}: run `make book` first")
    blocks, code_words = read_page(path.read_text(encoding="utf-8"))
    found = english_left(blocks, code_words, plain_identifiers=page == "api.html")
    assert not found, f"zh/{page}: {len(found)} blocks with English left:\n  " + "\n  ".join(found[:20])


_MATH_WORDS = re.compile(r"(?<![_^{])\\text\{([^{}]*)\}(\\!|\\left|\s)*(.?)")  # not a label such as S_\text{past}


def english_in_formulas(translation: str) -> list[str]:
    """The English words of a translation's formulas: `$n \\cdot \\text{bytes}$` should say 字节.

    A single word followed by an index, a power or an argument names a quantity, as a letter would
    (`\\text{head}_h`, `\\text{gain}^2`, `\\text{score}(q, k)`): it stays.
    """
    words = [w for w, _, nxt in _MATH_WORDS.findall(translation)
             if not (re.fullmatch(r"[A-Za-z]+", w.strip()) and nxt in ("_", "^", "(", "["))]
    return english_left(words)


@pytest.mark.parametrize("path", sorted((ROOT / "locale" / "zh_CN" / "LC_MESSAGES").rglob("*.po")),
                         ids=lambda p: p.name)
def test_the_words_of_formulas_are_translated(path):
    with path.open("rb") as f:
        found = [f"{m.id[:50]!r}: {english_in_formulas(m.string)}" for m in read_po(f) if m.id and m.string
                 and english_in_formulas(m.string)]
    assert not found, f"{path.name}: English inside \\text{{...}} of a formula:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("translation, english", [
    ("$$\n\\text{bytes} = 2 L H_{kv} D_h\n$$", True),
    ("对每个 $i$ 都有 $s_i \\le m \\quad \\text{for every } i$", True),
    ("$$\n\\text{字节数} = 2 L H_{kv} D_h\n$$", False),
    ("$S_\\text{past} + S_\\text{new}$ 个位置", False),                # a subscript's label is a name
    ("$(B, T, \\text{vocab})$", False),
    ("$E_{\\text{word}}[\\text{id}_t]$ 与 $\\text{head}_h$、$\\text{gain}^2$", False),     # quantities' names
    ("$\\text{head}_h = \\text{softmax of the scores}$", True),
])
def test_english_in_formulas_is_found(translation, english):
    assert bool(english_in_formulas(translation)) == english


# The test of the test: pages that must fail, and pages that must pass.
_PAGE = ('<html><head><title>1. 从零实现注意力 — 注意力机制</title></head><body>'
         '<article>{}</article></body></html>')


@pytest.mark.parametrize("body, left", [
    # English left where a reader sees it
    ("<p>The cache grows with every token.</p>", "The cache grows"),
    ("<p>缓存随每个词元增长，and it never shrinks。</p>", "and it never shrinks"),
    ("<h2>4.2 Split heads, every shape written out</h2>", "Split heads"),
    ('<p class="admonition-title"><span class="caption-number">练习 3 </span> (Split heads)</p>', "Split heads"),
    ('<p class="admonition-title">解答<a href="#x"> 练习 3 (<span>Merge heads</span>)</a></p>', "Merge heads"),
    ("<figure><img src='a.png'/><figcaption><p>Attention weights of head 3</p></figcaption></figure>",
     "Attention weights"),
    ("<table><tr><th>模型</th><th>heads</th></tr><tr><td>BERT</td><td>12</td></tr></table>", "heads?"),
    ('<div class="admonition note"><p class="admonition-title">Note</p><p>注意。</p></div>', "Note"),
    ('<details><summary><p class="collapsed admonition-title">Show code cell source</p></summary></details>',
     "Show code cell source"),
    ("<p>把 $x$ 投影到 the query space。</p>", "the query space"),
    ("<p>形状为 (B, T, D) of the input</p>", "of the input"),
    ("<p>Exercises</p>", "Exercises"),
    ('<dl class="glossary"><dt>attention</dt><dt>attention weights</dt><dd><p>矩阵。</p></dd></dl>', "weights"),
    ('<div class="cell_input"><pre><span class="c1"># split the heads</span></pre></div><p>Split heads</p>',
     "Split heads"),                                        # a word of a code comment is not an identifier
    ("<p>本节说明 gradient 为什么消失。</p>", "gradient?"),   # one word in a sentence (on the API page: a name)
    ("<p>用 Llama-style 解码器。</p>", "style"),                          # half of a compound
    ('<p class="admonition-title"><span class="caption-number">练习 31 </span> (Cross-attention)</p>',
     "Cross-attention"),
    ("<title>Masks — 注意力机制</title>", "Masks"),
    ("<p>x_0 = LayerNorm(word[id]) block (post-LN, as BERT): h = LN(x)</p>", "as"),      # API page
    ("<p>fn(q, k) returns the scores 的函数。</p>", "returns the scores"),               # API page
])
@pytest.mark.parametrize("plain_identifiers", [False, True], ids=["prose", "api"])
def test_english_left_on_a_page_is_found(body, left, plain_identifiers):
    """`left`: the English the test must report; a trailing "?": except on the API page."""
    if plain_identifiers and left.endswith("?"):
        pytest.skip("a lone lowercase word is an identifier's name on the API page")
    left = left.rstrip("?")
    blocks, code_words = read_page(_PAGE.format(body))
    found = english_left(blocks, code_words, plain_identifiers=plain_identifiers)
    assert found and all(w in " ".join(found) for w in left.split() if w.lower() not in TERMS), found


@pytest.mark.parametrize("body", [
    "<p>PyTorch、NumPy、transformers、MiniLM 与 Llama 都给出相同的数。</p>",        # names
    "<p>GQA 把 KV 缓存缩小为原来的 1/8；RoPE 与 SwiGLU 见第 7 章。</p>",          # acronyms, CamelCase
    '<p>对 <span class="math">\\(QK^\\top\\)</span> 的每一行做 softmax，得到 logits 的概率。</p>',  # terms
    '<p>调用 <code class="docutils literal"><span class="pre">attention(q, k, v)</span></code> 即可。</p>',
    '<p>它满足 <span class="math notranslate nohighlight">\\(\\text{for every } i\\)</span>。</p>',
    '<div class="cell_output docutils container"><pre>max |diff| = 0.0 and the same tokens</pre></div>',
    '<div class="cell docutils container"><div class="cell_input"><pre>x = the_input</pre></div></div>',
    '<div class="citation"><p>Ashish Vaswani and others. Attention is all you need. 2017.</p></div>',
    '<p>见 <span class="bibtex-citation">[<a href="#id1">Sha19</a>]</span>。</p>',
    "<p>句子 “The animal didn’t cross the street because it was too tired.” 中的 “it”。</p>",  # quoted
    "<p>再稍加训练（“增量训练”，uptraining），或学习率预热（warm-up）。</p>",                # glosses
    "<p>形状 (B, H, T, D_h)，调用 nn.Linear 与 torch.softmax(x, dim=-1)；d_k = 64。</p>",    # identifiers
    '<dl class="glossary"><dt id="term-attention">attention</dt><dt>注意力</dt><dd><p>一种加权平均。</p></dd>'
    '<dt id="term-kv-cache">KV cache</dt><dt>KV 缓存</dt><dd><p>键和值。</p></dd></dl>',
    '<p><a class="edition-link" href="../x.html">English</a></p>',
    "<p>参数 hidden_size 决定 D；下载 .ipynb 文件。</p>",
    '<dl class="py"><dt class="sig">f(x, mask=None)</dt><dd><p>返回 mask 为 True 的位置。</p></dd></dl>',
])
def test_a_page_with_only_allowed_english_passes(body):
    blocks, code_words = read_page(_PAGE.format(body))
    assert english_left(blocks, code_words) == []


def test_the_api_page_may_name_parameters_in_plain_text():
    body = "<p>在 Python 列表上的 fn(q, keys, values)：q (Dh,)，keys (S, Dh)，values (S, Dv) → 输出 (Dv,)。</p>"
    blocks, code_words = read_page(_PAGE.format(body))
    assert english_left(blocks, code_words, plain_identifiers=True) == []
    assert english_left(blocks, code_words) != []  # elsewhere, a word is code only when marked as code
