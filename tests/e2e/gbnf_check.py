"""An independent GBNF matcher for the e2e tests: parses llama.cpp's GBNF
format (docs/structured_output.md, "The format") in Python and decides
whether a whole text is a sentence of the grammar, so that outputs that
zinfer's C matcher (structured/grammar.c) produced are checked by other
code. Written from the format's rules, not from either implementation.

match(grammar_text, text) -> bool. The matcher computes, for each grammar
node and start position, the set of end positions (memoized), so any
grammar without left recursion works, ambiguous ones included; fine for
the short texts of tests, not fast."""

import functools
import sys

_ESC = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-",
        "/": "/", "'": "'"}


class GbnfError(ValueError):
    pass


class _Parser:
    def __init__(self, text):
        self.s, self.i = text, 0
        self.nodes = []  # ("lit", str) ("cls", [(lo, hi)], neg) ("ref", name)
        # ("seq", [ids]) ("alt", [ids]) ("rep", id, m, n|None)
        self.rules = {}

    def node(self, *n):
        self.nodes.append(n)
        return len(self.nodes) - 1

    def peek(self):
        return self.s[self.i] if self.i < len(self.s) else ""

    def skip(self, newlines):
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            else:
                return

    def name(self):
        j = self.i
        while self.i < len(self.s) and (self.s[self.i].isalnum() or self.s[self.i] in "-_"):
            self.i += 1
        if j == self.i:
            raise GbnfError(f"expected a name at {j}")
        return self.s[j:self.i]

    def char(self):
        c = self.s[self.i]
        self.i += 1
        if c != "\\":
            return c
        e = self.s[self.i]
        self.i += 1
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width:
            h = self.s[self.i:self.i + width]
            self.i += width
            return chr(int(h, 16))
        if e not in _ESC:
            raise GbnfError(f"bad escape \\{e}")
        return _ESC[e]

    def item(self, nested):
        c = self.peek()
        if c == '"':
            self.i += 1
            out = []
            while self.peek() != '"':
                if not self.peek():
                    raise GbnfError("unterminated literal")
                out.append(self.char())
            self.i += 1
            n = self.node("lit", "".join(out))
        elif c == "[":
            self.i += 1
            neg = self.peek() == "^"
            if neg:
                self.i += 1
            ranges = []
            while self.peek() != "]":
                if not self.peek():
                    raise GbnfError("unterminated class")
                lo = self.char()
                hi = lo
                if self.peek() == "-" and self.s[self.i + 1:self.i + 2] != "]":
                    self.i += 1
                    hi = self.char()
                ranges.append((ord(lo), ord(hi)))
            self.i += 1
            n = self.node("cls", ranges, neg)
        elif c == ".":
            self.i += 1
            n = self.node("cls", [], True)
        elif c == "(":
            self.i += 1
            self.skip(True)
            n = self.alternatives(True)
            self.skip(True)
            if self.peek() != ")":
                raise GbnfError("expected )")
            self.i += 1
        else:
            n = self.node("ref", self.name())
        while True:  # quantifiers
            q = self.peek()
            if q == "*":
                n, self.i = self.node("rep", n, 0, None), self.i + 1
            elif q == "+":
                n, self.i = self.node("rep", n, 1, None), self.i + 1
            elif q == "?":
                n, self.i = self.node("rep", n, 0, 1), self.i + 1
            elif q == "{":
                j = self.s.index("}", self.i)
                body = self.s[self.i + 1:j].replace(" ", "")
                self.i = j + 1
                if "," in body:
                    a, b = body.split(",")
                    n = self.node("rep", n, int(a), int(b) if b else None)
                else:
                    n = self.node("rep", n, int(body), int(body))
            else:
                return n

    def sequence(self, nested):
        items = []
        while True:
            self.skip(nested)
            c = self.peek()
            if c and (c in '"[(.' or c.isalnum() or c in "-_"):
                # a name followed by ::= starts the next rule
                if c not in '"[(.' and not nested:
                    j = self.i
                    self.name()
                    self.skip(False)
                    is_rule = self.s.startswith("::=", self.i)
                    self.i = j
                    if is_rule:
                        break
                items.append(self.item(nested))
            else:
                break
        return self.node("seq", items)

    def alternatives(self, nested):
        alts = [self.sequence(nested)]
        while self.peek() == "|":
            self.i += 1
            self.skip(True)
            alts.append(self.sequence(nested))
        return alts[0] if len(alts) == 1 else self.node("alt", alts)

    def parse(self):
        while True:
            self.skip(True)
            if self.i >= len(self.s):
                break
            name = self.name()
            self.skip(False)
            if not self.s.startswith("::=", self.i):
                raise GbnfError(f"expected ::= after {name}")
            self.i += 3
            self.skip(False)
            self.rules[name] = self.alternatives(False)
        if "root" not in self.rules:
            raise GbnfError("no root rule")
        return self


@functools.lru_cache(maxsize=64)
def _compile(grammar):
    return _parser_of(grammar)


def _parser_of(grammar):
    return _Parser(grammar).parse()


def match(grammar, text):
    """Whether text is a whole sentence of the GBNF grammar."""
    g = _compile(grammar)
    nodes, rules = g.nodes, g.rules
    memo = {}
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20000))

    def ends(n, i):
        key = (n, i)
        if key in memo:
            return memo[key]
        memo[key] = frozenset()  # left recursion would find nothing, not loop
        nd = nodes[n]
        kind = nd[0]
        if kind == "lit":
            r = {i + len(nd[1])} if text.startswith(nd[1], i) else set()
        elif kind == "cls":
            r = set()
            if i < len(text):
                cp = ord(text[i])
                inside = any(lo <= cp <= hi for lo, hi in nd[1])
                if inside != nd[2]:
                    r = {i + 1}
        elif kind == "ref":
            r = ends(rules[nd[1]], i)
        elif kind == "seq":
            r = {i}
            for x in nd[1]:
                r = {e for p in r for e in ends(x, p)}
                if not r:
                    break
        elif kind == "alt":
            r = set()
            for x in nd[1]:
                r |= ends(x, i)
        else:  # rep
            _, x, m, hi = nd
            r = {i}
            for _ in range(m):
                r = {e for p in r for e in ends(x, p)}
            out, seen, front, k = set(r), set(r), set(r), m
            while front and (hi is None or k < hi):
                front = {e for p in front for e in ends(x, p)} - seen
                seen |= front
                out |= front
                k += 1
            r = out
        memo[key] = frozenset(r)
        return memo[key]

    try:
        return len(text) in ends(rules["root"], 0)
    finally:
        sys.setrecursionlimit(old)
