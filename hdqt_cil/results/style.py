"""The figures' shared look: one colour per strategy and one marker per scheme, the same in every figure; a panel
of one strategy colours its schemes instead, each scheme's colour the same in every such panel (strategies and
schemes beyond these lists take the next ones in order of appearance)."""
SCHEME_ORDER = ["fp32", "hdqt", "hot", "int4", "luq", "fp8", "fp", "mxfp4", "nvfp4"]
STRATEGY_ORDER = ["naive", "lwf", "icarl", "bic", "joint", "replay", "der", "er_ace", "gdumb", "agem", "ewc", "si",
                  "dyn_der", "memo"]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h"]
# eight, told apart at a paper's line width: a figure of the authors' techniques beside a strategy's tagged runs
# holds six variants
LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 3))]


def _index(order: list, name: str) -> int:
    if name not in order:
        order.append(name)
    return order.index(name)


def scheme_rank(scheme: str) -> int:
    """A scheme's place in tables and lists: SCHEME_ORDER's, any other after them."""
    return SCHEME_ORDER.index(scheme) if scheme in SCHEME_ORDER else len(SCHEME_ORDER)


def _color(place: int):
    """tab20's ten hues first, then their light shades."""
    import matplotlib.pyplot as plt
    tab20 = plt.get_cmap("tab20").colors
    return (tab20[0::2] + tab20[1::2])[place % 20]


def scheme_marker(scheme: str, order: list) -> str:
    return MARKERS[_index(order, scheme) % len(MARKERS)]


def run_style(strategy: str, scheme: str, strategies: list, schemes: list, one_strategy: bool) -> dict:
    """A line's colour and marker: the strategy's colour, or in a panel of `one_strategy` the scheme's; the
    scheme's marker. `strategies` and `schemes` are the orders (STRATEGY_ORDER, SCHEME_ORDER) extended as names
    appear."""
    color = _color(_index(schemes, scheme) if one_strategy else _index(strategies, strategy))
    return {"color": color, "marker": scheme_marker(scheme, schemes)}
