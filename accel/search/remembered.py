"""What a search remembers through accel.plan.cache: the answer for a setup (looked up before measuring, kept once
established), and a costly candidate's warm-up as last measured on the setup (a search decides by it, not by a
guess, whether the warm-up fits its budget)."""
from __future__ import annotations

from typing import Any

from accel import clock
import accel.plan.cache as plancache
from accel.search.results import TuneResult
from accel.search.settings import COSTLY_GUESS_S


def cached_answer(facts: dict[str, Any] | None, cache: Any, started: float) -> TuneResult | None:
    """The remembered answer for these key facts (plancache.setup_key), marked as from the cache, or None."""
    hit = plancache.lookup(facts, cache) if facts is not None and cache else None
    if hit is None:
        return None
    result = TuneResult.from_dict(hit)
    result.from_cache, result.elapsed_s = True, clock.now() - started
    return result


def keep_answer(result: TuneResult, facts: dict[str, Any] | None, cache: Any, established: bool) -> None:
    """Remember an answer (its key goes on the result); one the search could not establish is not kept."""
    if facts is not None and cache and established:
        result.key = plancache.store(facts, result.to_dict(), cache)


def expected_warmup(candidate: dict[str, dict], facts: dict[str, Any] | None, cache: Any) -> tuple[float, str]:
    """The warm-up a costly candidate will take, and how that is known: as last measured on this setup (the
    cache, under the search's key facts), else assumed."""
    seen = plancache.known_warmup(plancache.warmup_parts(facts, candidate), cache) if facts and cache else None
    if seen is not None:
        return seen, "as measured on this setup before"
    return COSTLY_GUESS_S, "assumed before one is measured here"


def remember_warmup(candidate: dict[str, dict], facts: dict[str, Any] | None, cache: Any, seconds: float) -> None:
    if facts is not None and cache:
        plancache.remember_warmup(plancache.warmup_parts(facts, candidate), seconds, cache)
