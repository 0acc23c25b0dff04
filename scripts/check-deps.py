#!/usr/bin/env python3
"""scripts/check-deps.py: every file the CMake configure step found comes from a
package that scripts/install-deps.sh installs.

    python3 scripts/check-deps.py build/release/CMakeCache.txt [scripts/install-deps.sh]

For each absolute path in the cache (libraries, include folders, CMake config
folders, the programs the build needs: compilers, ninja, ccache, MPI, pkg-config), ask dpkg which installed package owns it, then fail,
naming the cache entry, the file and the package, when that package is neither
named in install-deps.sh nor pulled in by the Depends / Pre-Depends of a named
one (recursively, through virtual packages too), nor part of every Debian
system (Essential or Priority required). A folder several packages share is
satisfied by any one of them. Paths no package owns (a pyenv python, the build
tree) are listed and skipped.

Why: CI's machine once had a package installed by hand that a fresh machine
lacks (ocl-icd-opencl-dev, which libdnnl-dev only recommends), so the README's
commands failed for a newcomer while CI passed. Exit 0 when every file is
accounted for, 1 otherwise, 2 on bad usage.
"""
import os
import re
import subprocess
import sys


def listed_packages(script):
    """The packages named in install-deps.sh's `packages=( ... )` array."""
    text = open(script, encoding="utf-8").read()
    m = re.search(r"^packages=\((.*?)^\)", text, re.S | re.M)
    if not m:
        sys.exit(f"check-deps: {script}: no packages=( ... ) array found")
    names = []
    for line in m.group(1).splitlines():
        names += line.split("#", 1)[0].split()
    return names


def installed():
    """name -> (depends text, provides list, essential/required) for every installed package."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f=${Package}\t${Status}\t${Essential}\t${Priority}\t${Depends}, ${Pre-Depends}\t${Provides}\n"],
        check=True, capture_output=True, text=True).stdout
    pkgs, providers = {}, {}
    for line in out.splitlines():
        name, status, essential, priority, depends, provides = (line.split("\t") + [""] * 6)[:6]
        if not status.endswith("installed") or "not-installed" in status:
            continue
        pkgs[name] = (depends, essential == "yes" or priority == "required")
        for p in provides.split(","):
            p = p.strip().split(" ")[0]
            if p:
                providers.setdefault(p, []).append(name)
    return pkgs, providers


def closure(roots, pkgs, providers):
    """The installed packages that `roots` pull in through Depends and Pre-Depends."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop().split(":")[0]
        if name in seen:
            continue
        seen.add(name)
        for n in providers.get(name, []):  # a virtual package: whoever provides it here
            todo.append(n)
        if name not in pkgs:
            continue
        for group in pkgs[name][0].split(","):
            for alt in group.split("|"):  # any installed alternative satisfies the group
                alt = alt.strip().split(" ")[0].split(":")[0]
                if alt and (alt in pkgs or alt in providers):
                    todo.append(alt)
    return seen


def owners(paths):
    """path -> the installed packages dpkg says own it exactly. A path no package owns (a symlink made by
    update-alternatives) is owned by its resolved target's packages. The library a symlink names is what
    the build links, so a -dev package's libfoo.so counts for the -dev package, not the runtime one."""
    def ask(ps):
        r = subprocess.run(["dpkg-query", "-S"] + sorted(ps), capture_output=True, text=True)
        found = {}
        for line in r.stdout.splitlines():
            names, _, owned = line.rpartition(": ")
            if owned.strip() in ps:  # dpkg -S matches substrings; keep exact owners only
                found.setdefault(owned.strip(), set()).update(n.strip().split(":")[0] for n in names.split(","))
        return found
    found = ask(set(paths))
    unowned = {p: os.path.realpath(p) for p in paths if p not in found}
    resolved = ask(set(unowned.values())) if unowned else {}
    return {p: found.get(p) or resolved.get(unowned.get(p, ""), set()) for p in paths}


# The CMAKE_* programs a build cannot do without; the others (ar, nm, objcopy,
# linkers, addr2line) CMake takes from whatever is installed and falls back to
# binutils, which build-essential brings.
REQUIRED_CMAKE_PROGRAMS = {"CMAKE_CXX_COMPILER", "CMAKE_C_COMPILER", "CMAKE_MAKE_PROGRAM", "CMAKE_CXX_COMPILER_LAUNCHER",
                           "CMAKE_COMMAND", "CMAKE_CTEST_COMMAND"}


def cache_paths(cache, source_dir):
    """(entry, path) for every absolute path in CMakeCache.txt outside the source tree."""
    out = []
    for line in open(cache, encoding="utf-8", errors="replace"):
        m = re.match(r"^([A-Za-z0-9_.+-]+):(FILEPATH|PATH|STRING|INTERNAL)=(.*)$", line.rstrip("\n"))
        if not m:
            continue
        entry, value = m.group(1), m.group(3)
        if entry.startswith("CMAKE_INSTALL") or entry.endswith("_DEFAULT") or entry.startswith("_"):
            continue  # where things would go, not what was found
        if entry.startswith("CMAKE_") and entry not in REQUIRED_CMAKE_PROGRAMS:
            continue  # CMake's optional helpers (llvm-ar, ld.lld, ...): taken when present, never needed
        for v in value.split(";"):
            if not v.startswith("/") or "NOTFOUND" in v or not os.path.exists(v):
                continue
            real = os.path.realpath(v)
            if real.startswith(source_dir) or real.startswith("/tmp/"):
                continue
            out.append((entry, v))
    return out


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    cache = sys.argv[1]
    script = sys.argv[2] if len(sys.argv) == 3 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                 "install-deps.sh")
    source_dir = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    listed = listed_packages(script)
    pkgs, providers = installed()
    given = closure(listed + [n for n, (_, base) in pkgs.items() if base], pkgs, providers)
    bad, skipped, checked = [], [], 0
    entries = cache_paths(cache, source_dir)
    owned = owners({path for _, path in entries})
    for entry, path in entries:
        own = owned[path]
        if not own:
            skipped.append(f"{entry}={path}")
            continue
        checked += 1
        if not own & given:
            bad.append(f"{entry}: {path} comes from the Debian package {' or '.join(sorted(own))}, which "
                       f"{os.path.basename(script)} neither names nor pulls in (add it to its packages list)")
    for s in skipped:
        print(f"check-deps: skipped (no Debian package owns it): {s}")
    for b in bad:
        print(f"check-deps: error: {b}", file=sys.stderr)
    print(f"check-deps: {checked} files from Debian packages checked against {len(listed)} listed packages "
          f"({len(given)} with their dependencies): {len(bad)} missing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
