"""Structure figures of the code (not assertions), to compare a commit with another: lines per room, imports between
the project's files and the files that import each other, files over a size, the longest functions, the attributes
each engine class sets on `self`, the methods each task class overrides of its parents, and the imports that climb
the floors of docs/design.md (scripts and yolo/ > engine/tasks > engine > models, data, losses, evaluation > utils).
It reads the source as text (no import, no torch), so it measures any checkout.

    python -m benchmarks.structure                        # this checkout
    python -m benchmarks.structure --root /tmp/old-clone  # another one (e.g. a `git worktree` of an older commit)
"""

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "models", "data", "losses", "evaluation", "utils")
SCRIPT_DIRS = ("segment", "classify", "pose", "yolo")  # scripts, and the `yolo` command and API


def project_files(root):
    """The project's own Python files: the scripts and the packages (tests and benchmarks left out)."""
    files = [p for p in root.glob("*.py")]
    for d in PACKAGES + SCRIPT_DIRS:
        files += (root / d).rglob("*.py")
    return sorted(p for p in files if "__pycache__" not in p.parts)


def floor(rel):
    """The floor a file stands on (higher imports lower), from its path relative to the root."""
    parts = rel.parts
    if len(parts) == 1 or parts[0] in SCRIPT_DIRS:
        return 5
    if parts[0] == "engine":
        return 4 if parts[1] == "tasks" else 3
    if parts[0] in ("models", "data", "losses", "evaluation"):
        return 2
    return 1


def module_file(root, name):
    """The project file a dotted module name is, or None (another package)."""
    base = root.joinpath(*name.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def imported_files(root, tree):
    """(line, file) of every project module a parsed file imports, at any depth (lazy imports are arrows too)."""
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from pkg import sub` imports the submodule where one exists, else a name of pkg
            names = [f"{node.module}.{a.name}" if module_file(root, f"{node.module}.{a.name}") else node.module
                     for a in node.names]
        for name in names:
            p = module_file(root, name)
            if p is not None:
                yield node.lineno, p


def self_attributes(cls):
    """Names a class's own methods assign on `self` (plain, augmented, annotated and unpacking assignments)."""
    names = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AugAssign, ast.AnnAssign)) else []
        for t in targets:
            for e in ast.walk(t):
                if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                    names.add(e.attr)
    return names


def methods(cls):
    return {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def base_names(cls):
    return [b.attr if isinstance(b, ast.Attribute) else b.id for b in cls.bases if isinstance(b, (ast.Name,
                                                                                                  ast.Attribute))]


def cycles(edges):
    """The groups of files that import each other, directly or around a loop (strongly connected components of more
    than one file), each sorted; Tarjan's algorithm, iterative."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        out.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on:
                low[node] = min(low[node], index[child])
    return sorted(out)


def measure(root, big=400, top=5):
    trees = {p.relative_to(root): ast.parse(p.read_bytes(), str(p)) for p in project_files(root)}
    sizes = {rel: len((root / rel).read_bytes().splitlines()) for rel in trees}
    functions, classes, climbs, edges = [], {}, [], {}
    for rel, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno} {node.name}"))
            elif isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, (rel, node))
        for line, p in imported_files(root, tree):
            target = p.relative_to(root)
            if target != rel:
                edges.setdefault(str(rel), set()).add(str(target))
            if floor(target) > floor(rel):
                climbs.append(f"{rel}:{line} -> {target}")

    def ancestors(name, seen=()):
        for b in base_names(classes[name][1]) if name in classes else ():
            if b in classes and b not in seen:
                yield b
                yield from ancestors(b, (*seen, b))

    engine = {n: sorted(self_attributes(c)) for n, (rel, c) in classes.items()
              if rel.parts[0] == "engine" and rel.parts[1] != "tasks"}
    overrides = {n: sorted(methods(c) & set().union(*(methods(classes[a][1]) for a in ancestors(n))))
                 for n, (rel, c) in classes.items() if rel.parts[:2] == ("engine", "tasks")}
    rooms = {}
    for rel, n in sizes.items():
        room = rel.parts[0] if len(rel.parts) > 1 else "scripts"
        rooms[room] = rooms.get(room, 0) + n
    return {
        "files": len(trees), "lines": sum(sizes.values()),
        "lines per room": {k: f"{v} ({100 * v / sum(sizes.values()):.0f} %)" for k, v in
                           sorted(rooms.items(), key=lambda kv: -kv[1])},
        "imports between project files": sum(len(v) for v in edges.values()),
        "files that import each other": [" <-> ".join(g) for g in cycles(edges)],
        f"files over {big} lines": sorted(((n, str(r)) for r, n in sizes.items() if n > big), reverse=True),
        "longest functions": sorted(functions, reverse=True)[:top],
        "engine class attributes": {n: a for n, a in sorted(engine.items(), key=lambda kv: -len(kv[1])) if a},
        "task class overrides": dict(sorted(overrides.items())),
        "arrows that climb": climbs,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    p.add_argument("--big", type=int, default=400, help="a file over this many lines is listed")
    p.add_argument("--top", type=int, default=5, help="how many of the longest functions to list")
    p.add_argument("--names", action="store_true", help="list the attributes and overrides, not only count them")
    opt = p.parse_args()
    for key, value in measure(opt.root.resolve(), opt.big, opt.top).items():
        if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
            print(f"{key}: " + ", ".join(f"{k} {v}" for k, v in value.items()))
        elif isinstance(value, dict):
            print(f"{key}:")
            for name, items in value.items():
                print(f"  {name}: {len(items)}" + (f" ({', '.join(items)})" if opt.names else ""))
        elif isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print("  " + (f"{item[0]:5d}  {item[1]}" if isinstance(item, tuple) else item))
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
