#!/usr/bin/env python3
"""Held-out corpora from real text found on this machine, for benchmarks slimpack was not
developed on (docs/BENCHMARKS.md, "Held-out corpora").

Each corpus is a JSONL file of {"text": ...} records (one document per source file, or per
repository for the repository-level corpora), tokenized by slimpack's own cl100k tokenizer
(`slimpack lengths --tokenizer cl100k_base`) into target/heldout/<name>.lengths.txt. Which files
exist depends on the machine image (Debian 12 with LLVM 22, JDK 17, CPython 3.11, the crates of
Cargo.lock); the script prints each corpus's summary, so a figure is always quoted with it.

Usage: scripts/heldout-corpora.py [--slimpack target/release/slimpack] [NAME ...]
"""
import argparse
import glob
import gzip
import hashlib
import html
import json
import os
import re
import subprocess
import sys
import zipfile

HOME = os.path.expanduser("~")


def files_under(patterns):
    seen = []
    for pattern in patterns:
        seen.extend(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
    return sorted(set(seen))


def files_walked(roots, suffixes):
    """Files under `roots` ending in one of `suffixes`, in path order, links not followed (a
    recursive glob follows linked directories, and LLVM's tree links into itself)."""
    found = []
    for root in roots:
        for directory, _, names in os.walk(root):
            found.extend(os.path.join(directory, n) for n in names if n.endswith(suffixes))
    return sorted(p for p in found if os.path.isfile(p) and not os.path.islink(p))


def read_text(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except OSError:
            return ""
    return data.decode("utf-8", errors="replace")


def per_file(patterns):
    for path in files_under(patterns):
        yield read_text(path)


def per_directory(root, depth_glob):
    """One document per directory matching depth_glob under root: its files concatenated."""
    for directory in sorted(glob.glob(os.path.join(root, depth_glob))):
        if not os.path.isdir(directory):
            continue
        parts = []
        for path in files_under([os.path.join(directory, "**", "*")]):
            parts.append(f"// {os.path.relpath(path, directory)}\n{read_text(path)}")
        if parts:
            yield "\n".join(parts)


def java_sources(by_module):
    zips = sorted(p for p in glob.glob("/usr/lib/jvm/*/lib/src.zip") if os.path.isfile(p))
    if not zips:
        return
    with zipfile.ZipFile(zips[0]) as archive:
        names = sorted(n for n in archive.namelist() if n.endswith(".java"))
        if not by_module:
            for name in names:
                yield archive.read(name).decode("utf-8", errors="replace")
            return
        modules = {}
        for name in names:
            modules.setdefault(name.split("/", 1)[0], []).append(name)
        for module in sorted(modules):
            yield "\n".join(archive.read(n).decode("utf-8", errors="replace") for n in modules[module])


def python_packages():
    """One document per top-level Python package (its .py files concatenated in path order) or
    single-file module, from the system's and pyenv's Python libraries; a package installed
    alike in several Pythons counts once."""
    roots = sorted(glob.glob("/usr/lib/python3.*")) + sorted(site_packages())
    seen = set()
    for root in roots:
        if not os.path.isdir(root):
            continue
        for entry in sorted(os.listdir(root)):
            path = os.path.join(root, entry)
            if entry in ("__pycache__", "site-packages", "dist-packages", "lib-dynload"):
                continue
            if os.path.islink(path):
                continue
            text = None
            if os.path.isfile(path) and entry.endswith(".py"):
                text = read_text(path)
            elif os.path.isdir(path):
                files = files_walked([path], (".py",))
                if files:
                    text = "\n".join(
                        f"# file: {os.path.relpath(f, root)}\n{read_text(f)}" for f in files
                    )
            digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest() if text else None
            if digest and digest not in seen:
                seen.add(digest)
                yield text


def html_pages(roots):
    """One document per HTML page, as text: scripts and styles dropped, tags stripped, entities
    unescaped, runs of blanks collapsed (mdBook's print.html, a copy of a whole book, skipped)."""
    scripts = re.compile(r"<(script|style)\b.*?</\1>", re.S | re.I)
    tags = re.compile(r"<[^>]+>")
    blanks = re.compile(r"[ \t\r\f\v]+")
    empty_lines = re.compile(r"\n\s*\n+")
    for path in files_walked(roots, (".html",)):
        if os.path.basename(path) == "print.html":
            continue
        text = html.unescape(tags.sub(" ", scripts.sub(" ", read_text(path))))
        yield empty_lines.sub("\n\n", blanks.sub(" ", text)).strip()


def rust_toolchain():
    """The stable Rust toolchain's directory (else the first installed): one copy of its docs."""
    toolchains = sorted(glob.glob(f"{HOME}/.rustup/toolchains/*"))
    stable = [t for t in toolchains if os.path.basename(t).startswith("stable-")]
    return (stable or toolchains or ["/nonexistent"])[0]


def site_packages():
    return glob.glob("/root/.pyenv/versions/*/lib/python3*/site-packages") + glob.glob(
        "/usr/lib/python3/dist-packages"
    )


CORPORA = {
    # Source code, one document per file.
    "rust-files": lambda: per_file([f"{HOME}/.cargo/registry/src/*/*/**/*.rs"]),
    "cxx-headers": lambda: per_file(["/usr/lib/llvm-22/include/**/*", "/usr/include/**/*.h"]),
    "java-files": lambda: java_sources(by_module=False),
    "python-files": lambda: per_file([f"{d}/**/*.py" for d in site_packages()]),
    # Prose and markup: manual pages and Debian package documentation.
    "man-pages": lambda: per_file(["/usr/share/man/man*/*"]),
    "debian-docs": lambda: per_file(["/usr/share/doc/*/changelog*", "/usr/share/doc/*/copyright"]),
    # Repository-level code: one document per crate / per JDK module (most far above 128K).
    "rust-repos": lambda: per_directory(f"{HOME}/.cargo/registry/src", "*/*"),
    "java-modules": lambda: java_sources(by_module=True),
    # Added for the held-out sweep: LLVM's TableGen sources and generated tables (one per file,
    # up to ~6 MB each), Python code one document per package, the Rust toolchain's HTML
    # documentation as text (one per page: short pages, a few very long ones).
    "tablegen": lambda: (read_text(p) for p in files_walked(
        sorted(glob.glob("/usr/lib/llvm-*")), (".td", ".def", ".inc"))),
    "python-packages": python_packages,
    "rust-docs": lambda: html_pages([
        path
        for book in ("std", "core", "alloc", "proc_macro", "book", "reference", "nomicon",
                     "rust-by-example", "cargo", "rustc", "rustdoc", "edition-guide",
                     "embedded-book", "error_codes", "clippy")
        for path in glob.glob(f"{rust_toolchain()}/share/doc/rust/html/{book}")
    ]),
    # Added in stop 33, never used to develop or tune slimpack: Perl's modules, one document per
    # .pm file.
    "perl-modules": lambda: (read_text(p) for p in files_walked(
        ["/usr/share/perl", "/usr/share/perl5", "/usr/lib/x86_64-linux-gnu/perl",
         "/usr/lib/x86_64-linux-gnu/perl-base", "/usr/lib/x86_64-linux-gnu/perl5"], (".pm",))),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slimpack", default="target/release/slimpack")
    parser.add_argument("--out", default="target/heldout")
    parser.add_argument("names", nargs="*", help=f"corpora (default all): {', '.join(CORPORA)}")
    args = parser.parse_args()
    names = args.names or list(CORPORA)
    unknown = [n for n in names if n not in CORPORA]
    if unknown:
        sys.exit(f"error: unknown corpus {unknown[0]}; valid: {', '.join(CORPORA)}")
    os.makedirs(args.out, exist_ok=True)
    for name in names:
        jsonl = os.path.join(args.out, f"{name}.jsonl")
        count = 0
        with open(jsonl, "w") as out:
            for text in CORPORA[name]():
                out.write(json.dumps({"text": text}) + "\n")
                count += 1
        if count == 0:
            print(f"{name}: no files on this machine, skipped", file=sys.stderr)
            os.remove(jsonl)
            continue
        lengths = os.path.join(args.out, f"{name}.lengths.txt")
        subprocess.run(
            [args.slimpack, "lengths", "--batch", jsonl, "--batch-format", "corpus",
             "--tokenizer", "cl100k_base", "-o", lengths],
            check=True,
        )
        os.remove(jsonl)


if __name__ == "__main__":
    main()
