"""upload-artifact's layout: every matched file, relative to the least common ancestor of
the search paths (a glob's search path is the folder above its first wildcard)."""
import glob
import os
import shutil
import sys

store = os.path.join(os.environ["VERIFY_ATTN_ACT_STORE"], "artifacts", os.environ["NAME"])
files, roots = [], []
for line in os.environ["PATHS"].splitlines():
    line = line.strip()
    if not line:
        continue
    parts = line.rstrip("/").split("/")
    wild = next((i for i, p in enumerate(parts) if any(c in p for c in "*?[")), None)
    if wild is not None:
        roots.append(os.path.abspath("/".join(parts[:wild]) or "."))
    elif os.path.isdir(line):
        roots.append(os.path.abspath(line))
    else:
        roots.append(os.path.abspath(os.path.dirname(line.rstrip("/")) or "."))
    for match in glob.glob(line, recursive=True):
        if os.path.isdir(match):
            files += [os.path.join(d, f) for d, _, fs in os.walk(match) for f in fs]
        elif os.path.isfile(match):
            files.append(match)
if not files:
    print(f"upload-artifact stand-in: no files for {os.environ['NAME']}")
    sys.exit(1 if os.environ["MISSING"] == "error" else 0)
root = os.path.commonpath(roots)
for f in files:
    dest = os.path.join(store, os.path.relpath(os.path.abspath(f), root))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    shutil.copy2(f, dest)
print(f"upload-artifact stand-in: {os.environ['NAME']}: {len(files)} files")
