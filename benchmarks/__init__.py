"""The suite. Importing the package makes asv_runner read each benchmark's source once.

asv runs every (benchmark, parameters) in a child forked from a server that imported this
package, and the child builds its Benchmark afresh: asv_runner 0.3.2 reads and tokenizes the
source of the method, the setups and setup_cache, and hashes the tokens, although a version
set here makes that hash unused. That is 1.9 ms a run on the CI machine, 90% of building the
Benchmark, over ~7,500 runs of a full suite. Cached by function here, the server's own
discovery (before any fork) fills the caches and every child finds them filled: same values,
read once.
"""

import functools
import sys

# Under asv the runner that imports this package has imported it already; elsewhere (the
# tests import the benchmark modules directly) there is nothing to cache, and importing it
# would pull numpy into the modules.
_base = sys.modules.get("asv_runner.benchmarks._base")


def _cached(fn, key):
    cache = {}

    @functools.wraps(fn)
    def read_once(arg):
        k = key(arg)
        if k not in cache:
            cache[k] = fn(arg)
        return cache[k]

    read_once.cache = cache
    return read_once


def _function(obj):
    """A bound method's function: bound anew on each attribute access, the same function."""
    return getattr(obj, "__func__", obj)


def _sources(items):
    # get_source_code names the class of a bound method only: keep bound and plain apart
    return tuple((_function(f), hasattr(f, "__func__")) for f in items)


if _base is not None and not hasattr(_base.get_source_code, "cache"):
    _base.get_source_code = _cached(_base.get_source_code, _sources)
    _base.get_setup_cache_key = _cached(_base.get_setup_cache_key, _function)
    _base.code_fingerprint = _cached(_base.code_fingerprint, lambda code: code)
