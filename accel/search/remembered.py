"""What a search remembers through accel.plan.cache, for both searches (tune() and plan="auto" in your loop): the
answer for a setup (looked up before measuring, kept only when it is established and complete), and a costly
candidate's warm-up (compile's), kept apart for a warm start and a cold one of inductor's compile cache
(accel.accelerators.compile.cache): a warm start takes seconds where a cold one takes tens of seconds, so one remembered
number would mislead the next search whichever it was."""
from __future__ import annotations

from typing import Any

from accel import clock
import accel.accelerators.compile.cache as compile_cache
import accel.plan.cache as plancache
from accel.search.config import warmup_guess
from accel.search.results import TuneResult


def cached_answer(facts: dict[str, Any] | None, cache: Any, started: float) -> TuneResult | None:
    """The remembered answer for these key facts (plancache.key_parts), marked as from the cache, or None."""
    if facts is None or not cache:
        return None
    hit = plancache.lookup(facts, cache)
    if hit is None:
        return None
    result = TuneResult.from_dict(hit)
    result.from_cache, result.elapsed_s = True, clock.now() - started
    return result


def keep_answer(result: TuneResult, facts: dict[str, Any] | None, cache: Any, complete: bool) -> None:
    """Remember an answer (its key goes on the result); a noisy or cut-short one is not one to remember."""
    if facts is not None and cache and complete:
        result.key = plancache.store(facts, result.to_dict(), cache)


def starts_warm(candidate: dict[str, dict], model, device, cpu_model: str) -> bool:
    """Whether this costly candidate would start warm now (compile with inductor, whose graphs accel keeps):
    asked before it is tried, read-only (compile_cache.would_start_warm)."""
    options = candidate.get("compile")
    if options is None:
        return False
    return compile_cache.would_start_warm(model, device, cpu_model, compile_settings(options))


def compile_settings(options: dict[str, Any]) -> dict[str, Any]:
    """compile's options as its apply hands them to the compile cache's marker (accel/accelerators/compile/__init__.py)."""
    settings = {"backend": options.get("backend", "inductor"), "fullgraph": options.get("fullgraph", False),
                "dynamic": options.get("dynamic")}
    settings.update({k: options[k] for k in ("mode", "options") if options.get(k) is not None})
    return {**settings, "regional": bool(options.get("regional"))}


def warmup_key(facts: dict[str, Any], candidate: dict[str, dict], warm: bool) -> dict[str, Any]:
    """The facts a measured warm-up is kept under: the setup's, the candidate, and whether compile started warm."""
    return {**plancache.warmup_parts(facts, candidate), "start": "warm" if warm else "cold"}


def expected_warmup(candidate: dict[str, dict], facts: dict[str, Any] | None, cache: Any,
                    warm: bool = False) -> tuple[float, str]:
    """The warm-up a costly candidate will take, and how that is known: as measured on this setup by an earlier
    search starting as warm (or cold) as this one (the cache, under the search's key facts), else warmup_guess."""
    start = "a warm start" if warm else "a cold start"
    if facts is not None and cache:
        seen = plancache.known_warmup(warmup_key(facts, candidate, warm), cache)
        if seen is not None:
            return seen, f"as measured on this setup before, {start}"
    return warmup_guess(candidate, warm), f"assumed for {start} before one is measured here"


def remember_warmup(candidate: dict[str, dict], facts: dict[str, Any] | None, cache: Any, seconds: float,
                    warm: bool = False) -> None:
    if facts is not None and cache:
        plancache.remember_warmup(warmup_key(facts, candidate, warm), seconds, cache)
