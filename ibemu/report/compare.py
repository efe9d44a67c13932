"""Two runs of one scenario side by side: InfiniBand (ibemu's SM) and RoCEv2 (the fabric manager).

Pure: two ``ibemu.run/3`` (or ``/2``, ``/1``) result dicts in, a comparison (``ibemu.compare/1``) and a plain-text
table out. Faults are paired by their order (the same scenario injects the same faults),
flows by name. For every figure the comparison keeps both values and, where both are numbers
and the IB one is not zero, ``roce / ib``. A collective's efficiency is its bus bandwidth
(RoCE over IB); its loss is ``1 - efficiency``.

Shape (``comparison`` as :func:`compare` returns it)::

    {"schema": "ibemu.compare/1", "scenario": {"name", "file"},
     "kinds": {"ib": "ibemu SM (ftree)", "roce": "fabric manager (ECMP)"},
     "impairments": {"loss_pct", "delay_us", "ecn_mark_kb", "ecn_line_gbps"},  # the RoCE run's
     "bringup": {"fabric_s": PAIR, "sm_s": PAIR},
     "faults": [{"action", "target", "at_s", "phases_ms": {"detect": PAIR, ...},
                 "blackout_ms": {FLOW: PAIR}}],
     "traffic": [{"name", "kind", "gbps": PAIR, "error": PAIR,   # collectives also:
                  "time_us", "busbw_gbs", "wrong", "iterations", "retransmitted": PAIR,
                  # with ECN in the RoCE run: "ce_received", "cnp_sent", "cnp_received", "tx_paced": PAIR
                  }],
     "efficiency": {FLOW: roce/ib busbw (collectives) or Gb/s (other flows)},
     "fidelity": {"ib": {"valid", "worst_process", "worst_lag_us", "note"} or null, "roce": ...}}

(``fidelity``: each run's verdict, null for an ibemu.run/1 result; the table's head says
whether each side is valid, and an invalid side's figures are not to scale.)

A control (``control``: ``"ib"`` or ``"roce"``) compares two runs of the same kind: the
``ib`` / ``roce`` slots of every PAIR are then run A and run B, and every ratio should be 1;
the table says so and prints each flow's ratio as the control ratio (target 100 +- 3%).
``physics`` says what timed the frames: ``"link model"`` (both user datapaths, the same rates,
delays and buffers) or ``"kernel"``.

A variant (``variant``: ``"local-failover"`` or ``"adaptive-routing"``, :data:`VARIANTS`) compares two IB runs of the
same scenario and engine, side A with the switches failing over by themselves (alternates and
fault notices from ibemu's SM) and side B with SM-only recovery (``fabric.local_failover:
false``): the ``ib`` / ``roce`` slots of every PAIR are then side A and side B (the slots keep
their names so that readers of ibemu.compare/1 keep working), the ratio is B over A (how much
longer SM-only recovery blacks a flow out), and every fault carries the ``local_failover``
phase (null on side B). ``adaptive-routing``: side A with adaptive routing on the user
datapath (``fabric.adaptive_routing``), side B static (the LFTs' ports), ratio B over A. ``sides`` names what each slot holds (the run files' stems:
``ib``/``roce``, ``KIND-a``/``KIND-b`` for a control, ``local-failover``/``sm-only``);
``variant`` is null outside a variant comparison. Both keys are additions to ibemu.compare/1:
a reader of the older files treats them as absent (an IB/RoCE comparison or a control).
``phases_ms`` gains ``local_failover`` when either run has it (always in a variant).

where ``PAIR`` is ``{"ib": x, "roce": y, "ratio": y/x or null}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ibemu.report.result import PHASES, READABLE_VERSIONS
from ibemu.report.summary import DASH, table

SCHEMA = "ibemu.compare/1"
KINDS = ("ib", "roce")
COLLECTIVES = ("allreduce", "alltoall")
CC_KEYS = ("ce_received", "cnp_sent", "cnp_received", "tx_paced")
"""RoCE congestion control counters a flow may carry (with ECN in the fabric)."""
VARIANTS: dict[str, tuple[str, str]] = {"local-failover": ("local-failover", "sm-only"),
                                         "adaptive-routing": ("adaptive-routing", "static")}
"""Variant comparisons by name: the names of side A and side B (their run files' stems)."""
LOCAL_FAILOVER = "local_failover"

Result = Mapping[str, Any]


def _ratio(ib: Any, roce: Any) -> float | None:
    if isinstance(ib, bool) or isinstance(roce, bool):
        return None
    if isinstance(ib, int | float) and isinstance(roce, int | float) and ib:
        return round(roce / ib, 4)
    return None


def pair(ib: Any, roce: Any) -> dict[str, Any]:
    return {"ib": ib, "roce": roce, "ratio": _ratio(ib, roce)}


def _manager(r: Result) -> str:
    if r["fabric"]["kind"] == "roce":
        return "fabric manager (ECMP)"
    sm = r["sm"]
    if sm["impl"] == "none":
        return "no SM"
    return f"{sm['impl']} SM" + (f" ({sm['engine']})" if sm.get("engine") else "")


def sides(control: str | None = None, variant: str | None = None) -> tuple[str, str]:
    """The names of the two runs (their files' stems): ib/roce, KIND-a/KIND-b, or a variant's."""
    if control and variant:
        raise ValueError("a comparison is a control or a variant, not both")
    if variant is not None:
        if variant not in VARIANTS:
            raise ValueError(f"variant {variant!r}: one of {', '.join(VARIANTS)}")
        return VARIANTS[variant]
    return (f"{control}-a", f"{control}-b") if control else ("ib", "roce")


def _check_pair(ib: Result, roce: Result, control: str | None = None, variant: str | None = None) -> None:
    names = sides(control, variant)
    for kind, name, r in (("ib", names[0], ib), ("roce", names[1], roce)):
        what = kind if not (control or variant) else name
        if r.get("schema") not in READABLE_VERSIONS:
            raise ValueError(f"the {what} result is not an ibemu.run result ({', '.join(READABLE_VERSIONS)})")
        want = "ib" if variant else (control or kind)
        if r["fabric"]["kind"] != want:
            raise ValueError(f"the {what if variant else want} result is a {r['fabric']['kind']} run"
                             + (f" (a {variant} comparison is of two IB runs)" if variant else ""))


def compare(ib: Result, roce: Result, impairments: Mapping[str, float] | None = None, *,
            control: str | None = None, physics: str | None = None,
            variant: str | None = None) -> dict[str, Any]:
    """The comparison of an IB run and a RoCE run of the same scenario (``impairments``: the
    RoCE cables' ``loss_pct`` and ``delay_us``); ``control``: two runs of that kind instead;
    ``variant``: two IB runs, side A and side B of that variant (:data:`VARIANTS`)."""
    _check_pair(ib, roce, control, variant)
    with_lf = variant == "local-failover" or any(
        f["phases_ms"].get(LOCAL_FAILOVER) is not None for r in (ib, roce) for f in r["faults"])
    phases = (*PHASES[:1], LOCAL_FAILOVER, *PHASES[1:]) if with_lf else PHASES
    faults = []
    for i in range(max(len(ib["faults"]), len(roce["faults"]))):
        fi = ib["faults"][i] if i < len(ib["faults"]) else None
        fr = roce["faults"][i] if i < len(roce["faults"]) else None
        ref = fi or fr
        assert ref is not None
        ph_i = fi["phases_ms"] if fi else {}
        ph_r = fr["phases_ms"] if fr else {}
        flows_i = {f["flow"]: f for f in (fi["flows"] if fi else [])}
        flows_r = {f["flow"]: f for f in (fr["flows"] if fr else [])}
        names = list(dict.fromkeys([*flows_i, *flows_r]))
        faults.append({
            "action": ref["action"], "target": ref["target"], "at_s": ref["at_s"],
            "phases_ms": {p: pair(ph_i.get(p), ph_r.get(p)) for p in phases},
            "blackout_ms": {n: pair(flows_i.get(n, {}).get("blackout_ms"), flows_r.get(n, {}).get("blackout_ms"))
                            for n in names},
        })
    t_i = {t["name"]: t for t in ib["traffic"]}
    t_r = {t["name"]: t for t in roce["traffic"]}
    traffic = []
    efficiency: dict[str, float | None] = {}
    for name in dict.fromkeys([*t_i, *t_r]):
        a, b = t_i.get(name), t_r.get(name)
        ref = a or b
        assert ref is not None
        xa, xb = (a or {}).get("extra", {}), (b or {}).get("extra", {})
        row = {"name": name, "kind": ref["kind"],
               "gbps": pair(a and a["gbps"], b and b["gbps"]),
               "error": pair(xa.get("error"), xb.get("error"))}
        for key in CC_KEYS:
            if key in xa or key in xb:
                row[key] = pair(xa.get(key), xb.get(key))
        if ref["kind"] in COLLECTIVES:
            for key in ("time_us", "busbw_gbs", "wrong", "iterations", "retransmitted"):
                row[key] = pair(xa.get(key), xb.get(key))
            efficiency[name] = row["busbw_gbs"]["ratio"]
        else:
            efficiency[name] = row["gbps"]["ratio"]
        traffic.append(row)
    a_name, b_name = sides(control, variant)
    if variant:
        kinds = {"ib": f"{a_name}: {_manager(ib)}", "roce": f"{b_name}: {_manager(roce)}"}
    elif control:
        kinds = {"ib": f"{control} run A: {_manager(ib)}", "roce": f"{control} run B: {_manager(roce)}"}
    else:
        kinds = {"ib": _manager(ib), "roce": _manager(roce)}
    return {
        "schema": SCHEMA,
        "scenario": {"name": ib["scenario"]["name"], "file": ib["scenario"]["file"]},
        "kinds": kinds,
        "control": control,
        "variant": variant,
        "sides": {"ib": a_name, "roce": b_name},
        "physics": physics,
        "impairments": {"loss_pct": 0.0, "delay_us": 0.0, **(impairments or {})},
        "bringup": {k: pair(ib["bringup"][k], roce["bringup"][k]) for k in ("fabric_s", "sm_s")},
        "faults": faults,
        "traffic": traffic,
        "efficiency": efficiency,
        "fidelity": {"ib": _fidelity(ib), "roce": _fidelity(roce)},
    }


def _fidelity(r: Result) -> dict[str, Any] | None:
    f = r.get("fidelity")
    if not isinstance(f, Mapping):
        return None
    return {k: f.get(k) for k in ("valid", "worst_process", "worst_lag_us", "note")}


def _validity(f: Mapping[str, Any] | None) -> str:
    if f is None:
        return "fidelity unknown"
    if f.get("valid"):
        return "valid"
    lag = f.get("worst_lag_us")
    return "INVALID" + (f" ({f.get('worst_process')} p99 lag {lag / 1e3:.2f} ms)" if lag is not None else "")


def document(ib: Result, roce: Result, impairments: Mapping[str, float] | None = None, *,
             control: str | None = None, physics: str | None = None,
             variant: str | None = None) -> dict[str, Any]:
    """What ``ibemu compare --json`` writes: both results (slots ``ib`` and ``roce``: side A
    and side B of a control or a variant, named by the comparison's ``sides``) and their
    comparison."""
    return {"schema": SCHEMA, "runs": {"ib": dict(ib), "roce": dict(roce)},
            "comparison": compare(ib, roce, impairments, control=control, physics=physics, variant=variant)}


# ------------------------------------------------------------------ text


def _fmt(v: Any, unit: str) -> str:
    if v is None:
        return DASH
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, str):
        return v if len(v) <= 24 else v[:21] + "..."
    if isinstance(v, int):
        return f"{v:,}"
    if unit == "ms":
        return f"{v:.2f}" if v < 10 else (f"{v:.1f}" if v < 100 else f"{v:,.0f}")
    if unit == "s":
        return f"{v:.3f}"
    if unit == "us":
        return f"{v:,.0f}"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _ratio_text(p: Mapping[str, Any]) -> str:
    r = p.get("ratio")
    return DASH if r is None else f"{r:.2f}x"


def _row(label: str, p: Mapping[str, Any], unit: str = "") -> list[str]:
    return [label, _fmt(p["ib"], unit), _fmt(p["roce"], unit), _ratio_text(p)]


def render(comparison: Mapping[str, Any]) -> str:
    """The side-by-side table of a comparison."""
    c = comparison
    sc = c["scenario"]
    title = f"ibemu compare: {sc['name']}" + (f" ({sc['file']})" if sc.get("file") else "")
    rows: list[list[str]] = [["bring-up", "", "", ""]]
    rows.append(_row("  fabric up (s)", c["bringup"]["fabric_s"], "s"))
    rows.append(_row("  SM / manager up (s)", c["bringup"]["sm_s"], "s"))
    for i, f in enumerate(c["faults"], 1):
        rows.append([f"fault {i}: {f['action']} {f['target']} at {f['at_s']:g} s", "", "", ""])
        for p in f["phases_ms"]:
            rows.append(_row(f"  {p} (ms)", f["phases_ms"][p], "ms"))
        for flow, p in f["blackout_ms"].items():
            rows.append(_row(f"  blackout {flow} (ms)", p, "ms"))
    rows.append(["traffic", "", "", ""])
    for t in c["traffic"]:
        rows.append(_row(f"  {t['name']} ({t['kind']}) Gb/s", t["gbps"], "gbps"))
        if t["kind"] in COLLECTIVES:
            rows.append(_row(f"  {t['name']} time / iteration (us)", t["time_us"], "us"))
            rows.append(_row(f"  {t['name']} busbw (GB/s)", t["busbw_gbs"], "gbps"))
            rows.append(_row(f"  {t['name']} iterations", t["iterations"]))
            rows.append(_row(f"  {t['name']} #wrong", t["wrong"]))
            rows.append(_row(f"  {t['name']} packets retransmitted", t["retransmitted"]))
        for key in CC_KEYS:
            if key in t:
                rows.append(_row(f"  {t['name']} {key.replace('_', ' ')}", t[key]))
        if t["error"]["ib"] or t["error"]["roce"]:
            rows.append(_row(f"  {t['name']} error", t["error"]))
    control = c.get("control")
    variant = c.get("variant")
    a_name, b_name = (c.get("sides") or {}).get("ib", "A"), (c.get("sides") or {}).get("roce", "B")
    if variant:
        headers = ["", f"A: {c['kinds']['ib']}", f"B: {c['kinds']['roce']}", f"{b_name}/{a_name}"]
    elif control:
        headers = ["", f"A: {c['kinds']['ib']}", f"B: {c['kinds']['roce']}", "B/A"]
    else:
        headers = ["", f"ib: {c['kinds']['ib']}", f"roce: {c['kinds']['roce']}", "roce/ib"]
    lines = [title, "=" * len(title)]
    if variant == "local-failover":
        lines.append("VARIANT local-failover: the same IB fabric, SM and engine twice: A with the switches "
                     "failing over by themselves (alternates, fault notices), B with SM-only recovery "
                     "(fabric.local_failover: false); the ratio is B over A")
    if variant == "adaptive-routing":
        lines.append("VARIANT adaptive-routing: the same IB fabric (user datapath), SM and engine twice: A with "
                     "the switches choosing the least-loaded port of each group (fabric.adaptive_routing), B with "
                     "the LFTs' ports only; the ratio is B over A")
    if control:
        lines.append(f"CONTROL: both sides are {control} runs of the same scenario on the same physics: every "
                     "ratio should be 1.00 (target 100 +- 3%); a comparison is fair to the extent this holds")
    if c.get("physics") == "link model":
        lines.append("physics: both runs timed by the same link model (cable rates and delays, switch latency and "
                     "buffers per kind: IB credits, Ethernet drop tail / PFC / ECN)")
    fid = c.get("fidelity") or {}
    a, b = ("run A", "run B") if control else (a_name, b_name) if variant else ("ib", "roce")
    lines.append(f"fidelity: {a} {_validity(fid.get('ib'))}, {b} {_validity(fid.get('roce'))}")
    if any(f is not None and not f.get("valid") for f in fid.values()):
        lines.append("INVALID RUN: the figures of an invalid side are not to scale (it fell behind its clock)")
    imp = c.get("impairments") or {}
    if not control and (imp.get("loss_pct") or imp.get("delay_us")):
        lines.append(f"RoCE cables: {imp.get('loss_pct', 0):g}% of frames lost and {imp.get('delay_us', 0):g} us "
                     "added, per cable and direction; IB lossless")
    if not control and imp.get("ecn_mark_kb"):
        lines.append(f"RoCE congestion control: routers mark CE beyond {imp['ecn_mark_kb']:g} KiB queued at "
                     f"{imp.get('ecn_line_gbps', 0):g} Gb/s, hosts answer with CNPs, senders run DCQCN")
    lines.append(table(headers, rows, [False, True, True, True]))
    collectives = {t["name"] for t in c["traffic"] if t["kind"] in COLLECTIVES}
    if any(collectives & set(f["blackout_ms"]) for f in c["faults"]):
        lines.append("  (a collective is measured at each iteration's end: its blackout is at least the gap "
                     "between two iterations, set-up included)")
    eff = [(n, e) for n, e in c["efficiency"].items() if e is not None]
    if eff:
        lines.append("")
        for name, e in eff:
            kind = next(t["kind"] for t in c["traffic"] if t["name"] == name)
            what = "busbw" if kind in COLLECTIVES else "throughput"
            if variant:
                lines.append(f"  {name}: {b_name} {what} is {e * 100:.1f}% of {a_name}'s")
            elif control:
                ok = "within" if abs(e - 1) <= 0.03 else "OUTSIDE"
                lines.append(f"  {name}: control ratio {e * 100:.1f}% (run B's {what} over run A's; target "
                             f"100 +- 3%: {ok})")
            else:
                lines.append(f"  {name}: RoCE {what} is {e * 100:.1f}% of IB's "
                             f"(efficiency loss {(1 - e) * 100:.1f}%)")
    return "\n".join(lines) + "\n"
