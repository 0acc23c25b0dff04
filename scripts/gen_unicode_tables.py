#!/usr/bin/env python3
"""Generates io/unicode_tables.inc: the Unicode tables the tokenizers need.

Run by a developer (not CI):  python3 scripts/gen_unicode_tables.py > io/unicode_tables.inc

Hugging Face tokenizers takes its character classes from several Rust crates,
each pinned to its own Unicode version (Oniguruma for the GPT-2 regex,
unicode_categories for BERT's control/punctuation/mark tests, Rust std for
whitespace and lowercase, unicode-normalization-alignments for NFD). To be
exact rather than "close", every table is measured by probing the installed
`tokenizers` package one code point at a time, and the script reports where
that differs from Python's `unicodedata` (the version skew it papers over).
Surrogates (U+D800..U+DFFF) cannot occur in valid UTF-8 and are skipped.

Tables (all sorted, ranges inclusive):
  kRegexLetter, kRegexNumber, kRegexSpace  Oniguruma \\p{L}, \\p{N}, \\s (GPT-2 split)
  kBertControl    removed by BertNormalizer clean_text (besides U+0000, U+FFFD)
  kBertSpace      char::is_whitespace (BertNormalizer, BertPreTokenizer)
  kBertPunct      BertPreTokenizer punctuation
  kBertChinese    padded with spaces by handle_chinese_chars
  kStripRemoved   code points strip_accents deletes (nonspacing marks)
  kStripRuns / kStripMulti   strip_accents (NFD, marks dropped) mapping, Hangul excluded
  kLowerRuns / kLowerMulti   lowercase mapping
  kNfdRuns / kNfdMulti       full canonical decomposition (NFD of one code point), Hangul excluded
  kCombiningClass            canonical combining classes (nonzero), from unicodedata, checked by probing
  kCompose                   primary composites by their two-code-point canonical decomposition (NFC)
"""
import sys
import unicodedata

from tokenizers import Regex, normalizers, pre_tokenizers

CPS = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]


def ranges(cps):
    out = []
    for cp in sorted(cps):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return out


def probe_regex(pattern):
    split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    return {cp for cp in CPS if not split.pre_tokenize_str(chr(cp))}


def probe_map(normalizer):
    return {cp: r for cp in CPS if (r := normalizer.normalize_str(chr(cp))) != chr(cp)}


def report(name, probed, expected):
    extra, missing = probed - expected, expected - probed
    print(f"// {name}: {len(probed)} code points; vs unicodedata {unicodedata.unidata_version}: "
          f"+{len(extra)} -{len(missing)}", file=sys.stderr)


def cat(cp):
    return unicodedata.category(chr(cp))


def emit_array(ctype, name, items):
    """A C array of brace-initialized items, wrapped at 100 columns."""
    print(f"constexpr {ctype} {name}[] = {{")
    line = " "
    for item in items:
        item = f" {{{item}}},"
        if len(line) + len(item) > 100:
            print(line)
            line = " "
        line += item
    print(line)
    print("};\n")


def emit_ranges(name, cps):
    rs = ranges(cps)
    print(f"// {len(cps)} code points in {len(rs)} ranges.")
    emit_array("CodeRange", name, (f"0x{lo:X}, 0x{hi:X}" for lo, hi in rs))


def emit_map(name, mapping):
    """One-to-one entries become runs {lo, hi, delta, stride}; the rest go to kXMulti."""
    singles = sorted((cp, ord(r)) for cp, r in mapping.items() if len(r) == 1)
    multi = sorted((cp, r) for cp, r in mapping.items() if len(r) > 1)
    runs = []  # [lo, hi, delta, stride]
    for cp, to in singles:
        d = to - cp
        if runs:
            lo, hi, rd, st = runs[-1]
            if rd == d and ((lo == hi and cp - hi in (1, 2)) or cp - hi == st):
                runs[-1] = [lo, cp, d, cp - hi if lo == hi else st]
                continue
        runs.append([cp, cp, d, 1])
    print(f"// {len(singles)} one-to-one mappings in {len(runs)} runs.")
    emit_array("MapRun", f"{name}Runs", (f"0x{lo:X}, 0x{hi:X}, {d}, {st}" for lo, hi, d, st in runs))
    assert all(len(r) <= 4 for _, r in multi), "raise MultiMap::to's size"
    print(f"constexpr MultiMap {name}Multi[] = {{")
    for cp, r in multi:
        print(f"  {{0x{cp:X}, {len(r)}, {{{', '.join(f'0x{ord(c):X}' for c in r)}}}}},")
    if not multi:
        print("  {0x110000, 0, {0, 0, 0, 0}},  // none; sentinel keeps the array non-empty")
    print("};\n")


def main():
    letter = probe_regex(r"\p{L}")
    number = probe_regex(r"\p{N}")
    space = probe_regex(r"\s")
    report("regex L", letter, {cp for cp in CPS if cat(cp).startswith("L")})
    report("regex N", number, {cp for cp in CPS if cat(cp).startswith("N")})

    clean = probe_map(normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=False,
                                                 strip_accents=False, lowercase=False))
    control = {cp for cp, r in clean.items() if r == ""} - {0, 0xFFFD}
    report("bert control", control, {cp for cp in CPS if cat(cp) in ("Cc", "Cf", "Co")} - {9, 10, 13})

    bert_pre = pre_tokenizers.BertPreTokenizer()
    bert_space, bert_punct = set(), set()
    for cp in CPS:
        parts = [p for p, _ in bert_pre.pre_tokenize_str("a" + chr(cp) + "b")]
        if parts == ["a", "b"]:
            bert_space.add(cp)
        elif parts == ["a", chr(cp), "b"]:
            bert_punct.add(cp)
    report("bert punct", bert_punct, {cp for cp in CPS if cat(cp).startswith("P")})

    chinese = {cp for cp, r in probe_map(normalizers.BertNormalizer(
        clean_text=False, handle_chinese_chars=True, strip_accents=False, lowercase=False)).items()
               if r == " " + chr(cp) + " "}

    strip = probe_map(normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                                 strip_accents=True, lowercase=False))
    removed = {cp for cp, r in strip.items() if r == ""}
    report("strip removed", removed, {cp for cp in CPS if cat(cp) == "Mn"})
    # Hangul syllables decompose algorithmically; the C++ side does the same.
    for cp in range(0xAC00, 0xAC00 + 11172):
        assert strip.pop(cp) == unicodedata.normalize("NFD", chr(cp)), hex(cp)
    strip = {cp: r for cp, r in strip.items() if r != ""}
    # NOTE [nfd reordering]: the C++ side maps code point by code point. That
    # equals whole-string NFD + mark removal as long as every mark with a
    # nonzero combining class is removed (then reordering cannot be observed).
    kept_marks = [cp for cp in CPS if unicodedata.combining(chr(cp)) and cp not in removed]
    print(f"// combining-class marks strip_accents keeps: {len(kept_marks)}", file=sys.stderr)

    lower = probe_map(normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                                 strip_accents=False, lowercase=True))
    report("lower", set(lower), {cp for cp in CPS if chr(cp).lower() != chr(cp)})

    # NFC (Qwen2's normalizer): decomposition probed from NFD, composition pairs
    # from unicodedata's one-step decompositions, kept where NFC leaves the
    # composite itself (that drops the composition exclusions and singletons).
    hangul = set(range(0xAC00, 0xAC00 + 11172))
    nfd = probe_map(normalizers.NFD())
    for cp in hangul:
        assert nfd.pop(cp) == unicodedata.normalize("NFD", chr(cp)), hex(cp)
    report("nfd", set(nfd), {cp for cp in CPS if unicodedata.normalize("NFD", chr(cp)) != chr(cp)} - hangul)
    nfc_changed = probe_map(normalizers.NFC())
    compose = {}
    for cp in CPS:
        d = unicodedata.decomposition(chr(cp))
        if not d or d.startswith("<") or cp in hangul or cp in nfc_changed or cp not in nfd:
            continue
        parts = [int(x, 16) for x in d.split()]
        if len(parts) == 2:
            compose[(parts[0], parts[1])] = cp
    # Combining classes: unicodedata's, less the marks the crate's older Unicode
    # does not know (class 0 there: neither a class-1 mark after it nor a
    # class-240 mark before it is reordered).
    ccc, unknown = {}, 0
    nfd_of = normalizers.NFD().normalize_str
    for cp in CPS:
        c = unicodedata.combining(chr(cp))
        if not c:
            continue
        s1 = nfd_of("a" + chr(cp) + "\u0334") != "a" + chr(cp) + "\u0334"
        s2 = nfd_of("a\u0345" + chr(cp)) != "a\u0345" + chr(cp)
        if not s1 and not s2 and c not in (1, 240):
            unknown += 1
            continue
        ccc[cp] = c
    print(f"// combining marks unknown to the crate: {unknown}", file=sys.stderr)
    print(f"// nfc: {len(compose)} compositions, {len(ccc)} combining marks", file=sys.stderr)

    print("// Generated by scripts/gen_unicode_tables.py from the `tokenizers` package; do not edit.")
    print(f"// Python unicodedata {unicodedata.unidata_version} is the cross-check; see the script.\n")
    emit_ranges("kRegexLetter", letter)
    emit_ranges("kRegexNumber", number)
    emit_ranges("kRegexSpace", space)
    emit_ranges("kBertControl", control)
    emit_ranges("kBertSpace", bert_space)
    emit_ranges("kBertPunct", bert_punct)
    emit_ranges("kBertChinese", chinese)
    emit_ranges("kStripRemoved", removed)
    emit_map("kStrip", strip)
    emit_map("kLower", lower)
    emit_map("kNfd", nfd)
    cruns = []  # [lo, hi, class]
    for cp in sorted(ccc):
        if cruns and cruns[-1][1] == cp - 1 and cruns[-1][2] == ccc[cp]:
            cruns[-1][1] = cp
        else:
            cruns.append([cp, cp, ccc[cp]])
    print(f"// {len(ccc)} code points with a nonzero canonical combining class, in {len(cruns)} runs.")
    emit_array("ClassRange", "kCombiningClass", (f"0x{lo:X}, 0x{hi:X}, {c}" for lo, hi, c in cruns))
    print(f"// {len(compose)} primary composites: {{first, second, composite}}, sorted.")
    emit_array("Composition", "kCompose", (f"0x{a:X}, 0x{b:X}, 0x{c:X}" for (a, b), c in sorted(compose.items())))


if __name__ == "__main__":
    main()
