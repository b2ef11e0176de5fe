#!/usr/bin/env python3
"""The architecture's fitness check (docs/architecture.md), run by .ci/run.

1. Crate edges: every normal or build dependency between workspace crates, as `cargo metadata`
   reports it, must be an edge of the diagram below. Dev-dependencies are not layered: a test may
   drive the whole stack (a backend's transaction tests link the engine).
2. Module cycles: inside each crate, the top-level modules (the files and folders directly under
   `src/`) must not form an import cycle through `crate::` paths. A cycle accepted for a while
   would be listed in KNOWN_ENGINE_CYCLE (empty); a module joining a cycle, or a new cycle, fails
   the check, and the list may only shrink.
3. The dependency tree of the third-party example backend (examples/backend-nice) is counted and
   printed next to the engine's, the figure docs/architecture.md tracks; more crates than
   NICE_TREE_CEILING fails the check, so the tree every backend compiles cannot regrow unnoticed.

Exit 1 with every violation named; 0 otherwise.
"""

import json
import os
import re
import subprocess
import sys

# The diagram. Each crate names the workspace crates it may depend on (normal and build edges).
ALLOWED = {
    "agentdiff-host": set(),
    "agentdiff-test-support": {"agentdiff-host"},
    # Recorded runs for tests: above the engine, a dev-dependency only (checked below).
    "agentdiff-run-fixtures": {
        "agentdiff-engine", "agentdiff-store", "agentdiff-scan", "agentdiff-policy",
        "agentdiff-backend-api",
    },
    "agentdiff-backend-api": {"agentdiff-host"},
    "agentdiff-process": {"agentdiff-backend-api", "agentdiff-host"},
    "agentdiff-plugins": {"agentdiff-backend-api", "agentdiff-process", "agentdiff-host"},
    "agentdiff-policy": {"agentdiff-host"},
    # The egress proxy decides with the policy's network.egress and needs nothing else.
    "agentdiff-egress": {"agentdiff-policy"},
    "agentdiff-scan": {"agentdiff-policy", "agentdiff-host"},
    # The store seals the egress proxy's connection log (its types are the egress crate's).
    "agentdiff-store": {
        "agentdiff-scan", "agentdiff-policy", "agentdiff-egress", "agentdiff-backend-api",
        "agentdiff-host",
    },
    "agentdiff-engine": {
        "agentdiff-store", "agentdiff-scan", "agentdiff-policy", "agentdiff-egress",
        "agentdiff-plugins",
        "agentdiff-process", "agentdiff-backend-api", "agentdiff-host",
    },
    "agentdiff-report": {
        "agentdiff-engine", "agentdiff-store", "agentdiff-scan", "agentdiff-policy",
        "agentdiff-egress",
        "agentdiff-plugins", "agentdiff-backend-api", "agentdiff-host",
    },
    "agentdiff-conformance": {
        "agentdiff-engine", "agentdiff-store", "agentdiff-scan", "agentdiff-policy",
        "agentdiff-egress",
        "agentdiff-plugins", "agentdiff-process", "agentdiff-backend-api", "agentdiff-host",
    },
    # The CLI links everything, built-in backends included (that is how they register).
    "agentdiff": None,
}
# Every backend, built-in or example: the contract and the two toolkits, nothing above them.
BACKEND_ALLOWED = {"agentdiff-backend-api", "agentdiff-process", "agentdiff-host"}
BACKEND_PREFIX = "agentdiff-backend-"
NOT_BACKENDS = {"agentdiff-backend-api"}

# The engine's top-level modules still in one import cycle: none. Kept as a list so that a cycle
# accepted for a while is named here, and only here.
KNOWN_ENGINE_CYCLE = set()

# The crates whose top-level modules must form no cycle (the engine is ratcheted above).
CYCLE_FREE = [
    "engine", "engine/host", "engine/backend-api", "engine/process", "engine/plugins", "engine/policy",
    "engine/egress",
    "engine/scan", "engine/store", "engine/report",
    "backend-local", "backend-srt", "backend-container", "backend-bwrap", "conformance",
    "backends", "examples/backend-nice",
]

USE_RE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--locked"],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


# The most crates examples/backend-nice may build (normal and build edges, its four agentdiff crates
# included; docs/architecture.md gives the figure). Lower it when the tree shrinks; raise it only
# with a reason in the same commit.
NICE_TREE_CEILING = 25

# Test-only crates: no crate may take them as a normal or build dependency.
DEV_ONLY = {"agentdiff-test-support", "agentdiff-run-fixtures"}


def check_edges(meta):
    names = {p["name"] for p in meta["packages"]}
    problems = []
    for p in meta["packages"]:
        name = p["name"]
        deps = {
            d["name"] for d in p["dependencies"]
            if d["name"] in names and d["kind"] in (None, "build")
        }
        if name.startswith(BACKEND_PREFIX) and name not in NOT_BACKENDS:
            allowed = BACKEND_ALLOWED
        elif name in ALLOWED:
            allowed = ALLOWED[name]
        else:
            problems.append(f"{name}: a crate the diagram does not place; add it to "
                            "scripts/layers.py and docs/architecture.md")
            continue
        for d in sorted(deps & DEV_ONLY):
            problems.append(f"{name} -> {d}: a test-only crate as a normal dependency")
        if allowed is None:
            continue
        for d in sorted(deps - allowed):
            problems.append(f"{name} -> {d}: not an edge of the diagram (docs/architecture.md)")
    return problems


def top_modules(src):
    mods = {}
    for entry in sorted(os.listdir(src)):
        path = os.path.join(src, entry)
        if entry in ("lib.rs", "main.rs", "bin"):
            continue
        if entry.endswith(".rs"):
            mods[entry[:-3]] = [path]
        elif os.path.isdir(path):
            files = []
            for dirpath, _, filenames in os.walk(path):
                files += [os.path.join(dirpath, f) for f in filenames if f.endswith(".rs")]
            mods[entry] = files
    return mods


def strip_comments(text):
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def module_graph(src):
    mods = top_modules(src)
    graph = {m: set() for m in mods}
    for m, files in mods.items():
        for f in files:
            with open(f, encoding="utf-8") as fh:
                text = strip_comments(fh.read())
            for target in USE_RE.findall(text):
                if target in mods and target != m:
                    graph[m].add(target)
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def check_cycles():
    problems = []
    for crate in CYCLE_FREE:
        for comp in cycles(module_graph(os.path.join(crate, "src"))):
            problems.append(f"{crate}: top-level modules in an import cycle: {sorted(comp)}")
    for comp in cycles(module_graph("engine/src")):
        extra = comp - KNOWN_ENGINE_CYCLE
        if extra:
            problems.append(f"engine: modules joined an import cycle: {sorted(extra)} "
                            f"(cycle: {sorted(comp)})")
    engine_mods = set(top_modules("engine/src"))
    stale = (KNOWN_ENGINE_CYCLE & engine_mods) - set().union(set(), *cycles(module_graph("engine/src")))
    if stale:
        problems.append(f"engine: {sorted(stale)} are no longer in a cycle; remove them from "
                        "KNOWN_ENGINE_CYCLE in scripts/layers.py (the list only shrinks)")
    return problems


def tree_size(package):
    out = subprocess.run(
        ["cargo", "tree", "-p", package, "-e", "normal,build", "--prefix", "none", "--locked"],
        check=True, capture_output=True, text=True,
    ).stdout
    return len({re.sub(r" \((\*|proc-macro)\)", "", line) for line in out.splitlines() if line})


def main():
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    problems = check_edges(metadata()) + check_cycles()
    nice, engine = tree_size("agentdiff-backend-nice"), tree_size("agentdiff-engine")
    print(f"dependency tree (crates, normal + build): examples/backend-nice {nice}, "
          f"agentdiff-engine {engine}")
    if nice > NICE_TREE_CEILING:
        problems.append(
            f"examples/backend-nice builds {nice} crates, more than NICE_TREE_CEILING "
            f"({NICE_TREE_CEILING}): a new dependency (or tokio feature) of host, backend-api or "
            "process reaches every backend; drop it, or raise the ceiling in scripts/layers.py "
            "and docs/architecture.md with the reason")
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print("layers: every crate edge is in the diagram; no new module cycle")


if __name__ == "__main__":
    main()
