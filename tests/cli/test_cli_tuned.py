"""`tune` and `generate --tuned` on the command line: a pick tuned with the defaults is within its budget for the
chat's replies, and `generate --tuned` says so when the saved pick is not known to be within its budget for the
replies it is asked for."""
from spice_core.tools.cli import build_parser
from spice_core.tuned import TuneRecord


def lossy_record(**over) -> TuneRecord:
    """A lossy pick as `tune` saves it (confirmed on replies of 192 tokens unless ``over`` says otherwise)."""
    fields = dict(model="m", policy="spice", profile="rtx4090-pcie4x16", shape="deepseek-v2-lite", cache_frac=0.3,
                  budget={"ppl_pct": 1.0, "agreement": 0.9},
                  setting={"tau_approx": 0.05, "tau_prefetch": 0.2, "max_lookahead": 4, "lore_rank": 4,
                           "cpu_lane": True},
                  speed_ms=10.0, speed_timing="modeled", ppl_pct=0.5, agreement=0.95,
                  quality_measured_on="random ids", reason="the fastest setting within the budget",
                  confirmed=True, reply_tokens=192)
    return TuneRecord(**(fields | over))


def test_tunes_default_confirmation_is_as_long_as_the_chats_replies():
    """Regression: `tune` confirmed on replies of 32 tokens by default, so a lossy pick tuned with the defaults was
    not within its budget for the chat's replies (192 tokens by default, the length the app's own tune confirms on)."""
    from pages.common import DEFAULT_CHAT_TOKENS

    args = build_parser().parse_args(["tune"])
    assert args.confirm_new_tokens == DEFAULT_CHAT_TOKENS
    assert lossy_record(reply_tokens=args.confirm_new_tokens).within_budget_for(DEFAULT_CHAT_TOKENS)
