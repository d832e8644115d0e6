"""A tree cycle's acceptance walk, replayed from the record's draws: the children tried in order,
each draw against the renormalised residual, the path it accepts, how the next token is drawn
(a bonus or from the residual), and the greedy rule at temperature 0.
"""
import math

from engine.trace.check_basics import ABS_TOL, REL_TOL, RunFacts, close, fail, is_int, is_num
from engine.trace.schema import NEXT_BONUS, NEXT_RESIDUAL, ROOT
from engine.trace.tree_shape_checks import Shape, check_token, name_of

# The walk renormalises the target's float32 distribution: after siblings of total target
# mass R were rejected, the engine's r[t] is p / (S - R), where S, the float32 row's own sum,
# is 1 only to within float32 rounding (each of V entries rounded to 2^-24 relative, summed
# pairwise: about 1e-6 for V = 150k; top-k/top-p renormalise once more). Compared with
# p / (1 - R) from the recorded p's, that is a relative error of about |S - 1| / (1 - R),
# growing as the remaining mass 1 - R shrinks. MASS_SLACK bounds |S - 1| with ~100x headroom;
# once the remaining mass is below it, float noise rather than the rule sets r[t] (any value
# in [0, 1] is then possible), so nothing is compared.
MASS_SLACK = 1e-4


def expected_residual(p: float, removed: float) -> tuple[float, float] | None:
    """r[t] of a token of target probability p after siblings of mass `removed` were rejected, and
    its relative tolerance; None when so little mass is left that float noise decides (MASS_SLACK)."""
    if p == 0:
        return 0.0, REL_TOL  # a 0-mass token stays 0 in every renormalisation
    remaining = 1.0 - removed  # 1 for the first try: the target's row as it is
    if remaining <= MASS_SLACK:
        return None
    return p / remaining, REL_TOL + MASS_SLACK / remaining


def check_draw(entry: dict, p: float, removed: float, where: str, f: str) -> None:
    """One try: the draw and the residual's probability are in range, the probability is the
    renormalised residual's, and the decision is u < p_residual."""
    u, r = entry["u"], entry["p_residual"]
    if not 0.0 <= u < 1.0:
        fail(where, f"{f}.u", f"a uniform draw must lie in [0, 1), got {u!r:.40}")
    if not 0.0 <= r <= 1.0 + ABS_TOL:
        fail(where, f"{f}.p_residual", f"a probability must lie in [0, 1], got {r!r:.40}")
    want = expected_residual(p, removed)
    if want is not None and not math.isclose(r, want[0], rel_tol=want[1], abs_tol=ABS_TOL):
        rule = ("the node's p: the first try reads the target's distribution unmodified" if removed == 0 else
                f"p / (1 - {removed:.6g}), the residual renormalised after the rejected siblings")
        fail(where, f"{f}.p_residual", f"must be {want[0]:.6g} = {rule}; got {r:.6g}")
    if entry["accepted"] != (u < r):
        fail(where, f"{f}.accepted", f"the draw says {'accept' if u < r else 'reject'} (u < p_residual: "
                                     f"{u:.6g} against {r:.6g}) but the record says {str(entry['accepted']).lower()}")


def try_children(tried: list[dict], pos: int, parent: int, shape: Shape, nodes: list[dict],
                 where: str) -> tuple[int, int | None]:
    """The walk at `parent`: its children tried in order until one is accepted. Returns the next
    position in `tried` and the accepted child (None: all were rejected)."""
    removed = 0.0
    for kid in shape.children(parent):
        if pos == len(tried):
            fail(where, "tree.tried", f"stops before the walk does: node {kid}, a child of {name_of(parent)}, "
                                      "was never tried")
        entry, f = tried[pos], f"tree.tried[{pos}]"
        if entry["node"] != kid:
            fail(where, f"{f}.node", f"must be node {kid}: the children of {name_of(parent)} are tried in order, "
                                     "each until one is accepted")
        check_draw(entry, nodes[kid]["p"], removed, where, f)
        pos += 1
        if entry["accepted"]:
            return pos, kid
        removed += nodes[kid]["p"]
    return pos, None


def replay_walk(tree: dict, shape: Shape, where: str) -> tuple[list[int], int, str]:
    """The walk the record's draws make: (path, the node it ends at, how the next token is drawn)."""
    tried, pos, node, path = tree["tried"], 0, ROOT, []
    kind = NEXT_BONUS  # reached a node without children: the target's full distribution there
    while shape.children(node):
        pos, chosen = try_children(tried, pos, node, shape, tree["nodes"], where)
        if chosen is None:
            kind = NEXT_RESIDUAL  # every child rejected: the residual at `node`
            break
        path.append(chosen)
        node = chosen
    if pos != len(tried):
        fail(where, f"tree.tried[{pos}]", f"tried after the walk ended at {name_of(node)} "
                                          f"({'no children' if kind == NEXT_BONUS else 'every child rejected'})")
    return path, node, kind


def check_path(recorded: list, walked: list[int], shape: Shape, where: str) -> None:
    """The recorded path runs from a child of the root down, and is the walk's accepted nodes."""
    above = ROOT
    for j, node in enumerate(recorded):
        if not is_int(node) or node not in shape.children(above):
            fail(where, f"tree.path[{j}]", f"{node!r:.20} is not a child of {name_of(above)}: the path runs from "
                                           "a child of the root down, each node a child of the one before")
        above = node
    if recorded != walked:
        fail(where, "tree.path", f"must be the accepted tried nodes, in order: {walked}")


def check_next(tree: dict, shape: Shape, end: int, kind: str, facts: RunFacts, where: str) -> None:
    """How the next token was drawn, and the residual it was drawn from."""
    recorded = tree["next_token_kind"]
    if recorded not in (NEXT_BONUS, NEXT_RESIDUAL):
        fail(where, "tree.next_token_kind", f"must be '{NEXT_BONUS}' or '{NEXT_RESIDUAL}', got {recorded!r:.40}")
    if recorded != kind:
        why = (f"{name_of(end)} has no children, so the next token is a bonus from the target's full distribution"
               if kind == NEXT_BONUS else f"every child of {name_of(end)} was rejected, so the next token is drawn "
               "from the residual (a bonus only where the walk reaches a node without children)")
        fail(where, "tree.next_token_kind", f"must be '{kind}': {why}")
    nxt = tree["next_token_id"]
    check_token(nxt, facts.vocab_size, where, "tree.next_token_id")
    if kind == NEXT_BONUS:
        if tree["residual_top"] is not None:
            fail(where, "tree.residual_top", "a bonus is drawn from the target's full distribution: residual_top is null")
        return
    rejected = {shape.tokens[kid]: tree["nodes"][kid]["p"] for kid in shape.children(end)}
    if nxt in rejected:
        fail(where, "tree.next_token_id", f"token {nxt} is a rejected child's: its residual probability is 0")
    check_tree_residual(tree["residual_top"], nxt, rejected, facts, where)


def check_tree_residual(res, nxt: int, rejected: dict[int, float], facts: RunFacts, where: str) -> None:
    """residual_top: the rejected children's tokens at residual 0, the drawn token above 0."""
    if res is None or not 1 <= len(res) <= facts.trace_top_k + 1:
        fail(where, "tree.residual_top", f"a residual draw records its residual: 1..{facts.trace_top_k + 1} entries")
    for e in res:
        if not isinstance(e, dict) or not is_int(e.get("token_id")) or not isinstance(e.get("text"), str) or \
                not all(is_num(e.get(f)) and 0 <= e[f] <= 1 + ABS_TOL for f in ("p_target", "residual")):
            fail(where, "tree.residual_top", "entries are {token_id, text, p_target, residual} with both in [0, 1]")
        check_token(e["token_id"], facts.vocab_size, where, "tree.residual_top")
        if e["token_id"] in rejected and (e["residual"] > ABS_TOL or not close(e["p_target"], rejected[e["token_id"]])):
            fail(where, "tree.residual_top", f"rejected token {e['token_id']} is listed at residual {e['residual']:.6g}, "
                 f"p_target {e['p_target']:.6g}: a rejected child leaves the residual (0) and keeps its node's p")
    if not any(e["token_id"] == nxt and e["residual"] > 0 for e in res):
        fail(where, "tree.residual_top", "the drawn token must be listed with a residual probability above 0")


def check_greedy_tree(tree: dict, shape: Shape, end: int, where: str) -> None:
    """Temperature 0: one-hot target rows, so an accepted node's p is 1, a rejected one's 0,
    and the next token is the target's argmax after the walk's last node."""
    nodes = tree["nodes"]
    for e in tree["tried"]:
        p, want = nodes[e["node"]]["p"], 1.0 if e["accepted"] else 0.0
        if p != want:
            fail(where, f"tree.nodes[{e['node']}].p", f"temperature 0: the target's distribution is one-hot, so an "
                 f"{'accepted' if e['accepted'] else 'rejected'} node's p is {want:g}, got {p:.6g}")
    for i, n in enumerate(nodes):
        if n["p"] not in (0.0, 1.0):
            fail(where, f"tree.nodes[{i}].p", "temperature 0: the target's distribution is one-hot, so p is 0 or 1")
    argmax = tree["target_top"][shape.row(end)]
    if len(argmax) != 1 or argmax[0]["token_id"] != tree["next_token_id"]:
        fail(where, "tree.next_token_id", f"temperature 0: the next token is the target's argmax after "
                                          f"{name_of(end)} (target_top row {shape.row(end)})")
