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


def _generate_tuned(capsys, model, record, max_new_tokens):
    from spice_core.tuned import save, tuned_path

    from cli_helpers import run_cli

    tuned_path(model).unlink(missing_ok=True)      # the model is shared by the module's tests: this pick alone
    save(record, tuned_path(model))
    return run_cli(capsys, ["generate", "--model", model, "--device", "cpu", "--policy", "spice", "--cache-frac",
                            record.cache_frac, "--profile", record.profile, "--shape", record.shape, "--raw",
                            "--prompt", "hello", "--max-new-tokens", max_new_tokens, "--tuned"])


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("spice_core")]


def test_generate_tuned_warns_when_the_pick_was_never_confirmed(tiny_model, capsys, caplog):
    """Regression: `generate --tuned` applied a lossy pick that was never confirmed (`tune --no-confirm`, or a file
    written before the confirmation) without a word, its note quoting the screening's quality as if it held. It is
    applied (the user asked for it), with one warning on stderr saying why it is not known to be within its budget
    and how to confirm it, and the run's note says so."""
    code, out, _ = _generate_tuned(capsys, tiny_model, lossy_record(confirmed=False, reply_tokens=0), 4)
    assert code == 0 and "note: tuned setting from" in out
    assert "not known to be within its budget for replies of 4 tokens" in out
    (warning,) = _warnings(caplog)
    assert "\n" not in warning and "never confirmed" in warning and "--confirm-new-tokens 4 or more" in warning
    assert "without --no-confirm" in warning


def test_generate_tuned_warns_when_the_replies_are_longer_than_the_pick_was_confirmed_on(tiny_model, capsys,
                                                                                          caplog):
    """Regression: a pick confirmed on replies of 2 tokens was applied to replies of 6 without a word."""
    code, out, _ = _generate_tuned(capsys, tiny_model, lossy_record(reply_tokens=2), 6)
    assert code == 0 and "not known to be within its budget for replies of 6 tokens" in out
    (warning,) = _warnings(caplog)
    assert "confirmed on replies of 2 tokens, shorter than yours (6 tokens)" in warning
    assert "--max-new-tokens 2 or fewer" in warning


def test_generate_tuned_is_silent_for_a_pick_confirmed_on_replies_at_least_as_long(tiny_model, capsys, caplog):
    code, out, _ = _generate_tuned(capsys, tiny_model, lossy_record(reply_tokens=6), 6)
    assert code == 0 and "note: tuned setting from" in out and "not known" not in out and _warnings(caplog) == []


def test_generate_tuned_refuses_a_file_tuned_on_another_model(tiny_model, tmp_path, capsys):
    """Regression (review): `--tuned FILE` with a file tuned on another model applied its pick, and the note quoted
    that model's measured quality as this one's. The file beside the model is its own whatever the folder is called."""
    from spice_core.tuned import save

    from cli_helpers import run_cli

    record = lossy_record(model="some-other-model")
    elsewhere = tmp_path / "copied-tuned.json"
    save(record, elsewhere)
    code, out, err = run_cli(capsys, ["generate", "--model", tiny_model, "--device", "cpu", "--policy", "spice",
                                      "--cache-frac", record.cache_frac, "--profile", record.profile, "--shape",
                                      record.shape, "--raw", "--prompt", "hello", "--max-new-tokens", 2,
                                      "--tuned", elsewhere])
    assert code == 2 and "was tuned on model some-other-model" in err and "Traceback" not in err, err
    code, out, _ = _generate_tuned(capsys, tiny_model, record, 2)     # the model's own file: applied
    assert code == 0 and "note: tuned setting from" in out


def test_tune_refuses_an_out_file_it_could_not_save_to_before_the_search(no_long_work, tmp_path, capsys):
    """Regression (review): an --out holding something other than tuned settings was refused only after the whole
    search (minutes), and the pick was lost."""
    from cli_helpers import run_cli

    other = tmp_path / "notes.json"
    other.write_text('{"something": "else"}', encoding="utf-8")
    code, _, err = run_cli(capsys, ["tune", "--out", other])
    assert code == 2 and "is not a tuned-settings file" in err, err
    assert other.read_text(encoding="utf-8") == '{"something": "else"}'


def test_generate_tuned_refuses_a_pick_tuned_before_the_model_was_calibrated_again(tmp_path, capsys):
    """Regression (review): a pick tuned, then `calibrate` run again, was applied with the new draft heads and LoRE
    and its note quoted the old ones' measured quality (or failed on a LoRE rank the new factors lack, with a fix
    that --tuned overrode). A pick records its artifacts' calibration digest, and one that differs is refused."""
    from spice_core.engine import SpiceEngine
    from spice_core.tools.calibrate import calibrate
    from spice_core.tuned import TuneRecord, stale_reason
    from tiny_models import build_tiny

    model = build_tiny("mixtral", tmp_path / "mixtral")
    calibrate(model, max_tokens=300, seq_len=64, distances=2, epochs=1, lore=False)
    digest = SpiceEngine.load(model, device="cpu").info().calibration
    assert len(digest) == 16
    code, out, _ = _generate_tuned(capsys, model, lossy_record(reply_tokens=6, calibration=digest), 2)
    assert code == 0 and "note: tuned setting from" in out
    calibrate(model, max_tokens=300, seq_len=64, distances=2, epochs=1, lore=False, seed=1)     # rebuilt
    assert SpiceEngine.load(model, device="cpu").info().calibration != digest
    from cli_helpers import run_cli

    code, out, err = run_cli(capsys, ["generate", "--model", model, "--device", "cpu", "--policy", "spice",
                                      "--cache-frac", 0.3, "--profile", "rtx4090-pcie4x16", "--shape",
                                      "deepseek-v2-lite", "--raw", "--prompt", "hello", "--max-new-tokens", 2, "--tuned"])
    assert code == 2 and "rebuilt since" in err and "tune" in err and "Traceback" not in err, err
    # a record from before digests were kept (or a model without calibration) is not judged
    assert stale_reason(lossy_record(), digest) == "" and stale_reason(lossy_record(calibration=digest), "") == ""
    assert isinstance(TuneRecord(**lossy_record(calibration=digest).as_dict()), TuneRecord)


def test_tune_without_out_on_an_unwritable_model_folder_says_to_pass_out(no_long_work, tiny_model, capsys,
                                                                           monkeypatch):
    """Regression (review): on a read-only checkpoint `tune` said "--out DIR: ... pass a writable folder", naming a
    flag the user never passed and asking for a folder where --out takes a file."""
    import spice_core.user_files as uf
    from spice_core.errors import ConfigError

    from cli_helpers import run_cli

    def read_only(path, flag):
        raise ConfigError(f"{flag} {path}: cannot write in {path} (Read-only file system): pass a writable folder")

    monkeypatch.setattr(uf, "check_writable_dir", read_only)
    code, _, err = run_cli(capsys, ["tune", "--model", tiny_model])
    assert code == 2 and "tune saves its pick beside the model" in err and "pass --out FILE" in err, err
    assert "Read-only file system" in err and "generate --tuned FILE" in err


def test_a_pick_tuned_on_a_profile_file_is_filed_under_that_profile_and_only_applied_with_it(tiny_model, capsys,
                                                                                             tmp_path):
    """Regression (review): `tune --hw-profile FILE` saved its pick as the default profile's (and `quality` labelled its
    numbers so), then `generate --tuned` with the stock profile applied a pick timed on another machine's numbers."""
    import json

    from cli_helpers import GOOD_PROFILE, run_cli

    hw = tmp_path / "hw.json"
    hw.write_text(json.dumps(dict(GOOD_PROFILE, name="my-box")))
    out = tmp_path / "tuned.json"
    code, _, err = run_cli(capsys, ["tune", "--model", tiny_model, "--hw-profile", hw, "--out", out, "--no-confirm",
                                    "--max-tokens", "16", "--n-prompts", "1", "--new-tokens", "2", "--cache-frac", "0.5",
                                    "--shape", "deepseek-v2-lite"])
    assert code == 0, err
    (rec,) = json.loads(out.read_text())["records"]
    assert rec["profile"].startswith("my-box#") and f"profile {rec['profile']}" in rec["speed_timing"], rec
    gen = ["generate", "--model", tiny_model, "--policy", "spice", "--cache-frac", "0.5", "--shape", "deepseek-v2-lite",
           "--prompt", "hi", "--max-new-tokens", "2", "--tuned", out]
    code, _, err = run_cli(capsys, gen)                      # the stock profile: not this pick's
    assert code == 2 and "no tuned setting for profile rtx4090-pcie4x16" in err and "my-box" in err, err
    code, text, err = run_cli(capsys, [*gen, "--hw-profile", hw])
    assert code == 0 and "tuned setting from" in text, err
    again = tmp_path / "hw2.json"        # the same name, other numbers (calibrated again): another machine to the pick
    again.write_text(json.dumps(dict(GOOD_PROFILE, name="my-box", h2d_pinned_gbps=GOOD_PROFILE["h2d_pinned_gbps"] / 2)))
    code, _, err = run_cli(capsys, [*gen, "--hw-profile", again])
    assert code == 2 and "no tuned setting for profile my-box#" in err, err
    code, text, err = run_cli(capsys, ["quality", "--model", tiny_model, "--hw-profile", hw, "--json", "--max-tokens", "16",
                                       "--n-prompts", "1", "--new-tokens", "2", "--cache-frac", "0.5"])
    assert code == 0, err
    assert "my-box" in json.loads(text)["step_ms_timing"] and "rtx4090" not in text, text


def test_generate_tuned_refuses_the_lossy_int8_lane_the_pick_was_not_measured_with(tiny_model, tmp_path, capsys):
    """Regression (review): `--tuned --tau-int8 0.3` ran 246 int8 CPU experts while its note quoted the pick's measured
    quality (measured with tau_int8 0: `tune` refuses --tau-int8). A record's setting sets tau_int8 0 too."""
    from spice_core.config import RunSettings

    from cli_helpers import run_cli

    record = lossy_record()
    assert record.settings(RunSettings(tau_int8=0.3)).tau_int8 == 0.0
    code, _, err = run_cli(capsys, ["generate", "--model", tiny_model, "--policy", "spice", "--tau-int8", "0.3",
                                    "--prompt", "hello", "--tuned"])
    assert code == 2 and "--tuned: the pick was measured with tau_int8 0" in err and "Traceback" not in err, err


def test_two_models_picks_share_a_file_and_each_finds_its_own(tmp_path):
    """Regression (review): tuning a second model into the same --out file deleted the first model's pick for the same
    profile, shape and cache."""
    from spice_core.errors import ConfigError
    from spice_core.tuned import find, load_all, save

    path = tmp_path / "shared.json"
    save(lossy_record(model="a", speed_ms=10.0), path)
    save(lossy_record(model="b", speed_ms=20.0), path)
    save(lossy_record(model="a", speed_ms=11.0), path)            # a's again: replaces a's only
    assert sorted((r.model, r.speed_ms) for r in load_all(path)) == [("a", 11.0), ("b", 20.0)]
    key = dict(profile="rtx4090-pcie4x16", shape="deepseek-v2-lite", cache_frac=0.3)
    assert find(path, model="b", **key).speed_ms == 20.0 and find(path, model="a", **key).speed_ms == 11.0
    import pytest

    with pytest.raises(ConfigError, match="was tuned on model a, b, not c"):
        find(path, model="c", **key)
    # The file beside a model (no model asked): that model's own pick, never the last saved of another's (review).
    assert find(path, prefer="a", **key).speed_ms == 11.0 and find(path, prefer="b", **key).speed_ms == 20.0
    with pytest.raises(ConfigError, match="was tuned on model a, b, not c"):
        find(path, prefer="c", **key)
    only_a = tmp_path / "renamed.json"
    save(lossy_record(model="a"), only_a)
    assert find(only_a, prefer="folder-renamed", **key).model == "a"     # one model's file: its own, renamed


def test_a_hand_edited_record_with_more_than_the_tuned_knobs_or_a_broken_trial_is_refused(tmp_path):
    """Regression (review): a record whose setting also held cache_frac 1.0 and max_new_tokens 3 was applied as is
    (a run at 100% cache stopping after 3 tokens), and trials without speed_ms or with an unknown verdict made the
    app's page load fail with a KeyError."""
    import json

    import pytest

    from spice_core.errors import ConfigError
    from spice_core.tuned import load_all, save

    path = tmp_path / "t.json"
    trial = {**lossy_record().setting, "speed_ms": 10.0, "ppl_pct": 0.5, "agreement": 0.95, "verdict": "held"}
    save(lossy_record(trials=[trial]), path)
    assert load_all(path)[0].trials == [trial]
    good = json.loads(path.read_text())
    for edit, words in [(lambda r: r["setting"].update(cache_frac=1.0, max_new_tokens=3), "not the tuned knobs"),
                        (lambda r: r["setting"].pop("cpu_lane"), "not the tuned knobs"),
                        (lambda r: r["trials"][0].pop("speed_ms"), "trial 0 has no speed_ms"),
                        (lambda r: r["trials"][0].update(speed_ms="fast"), "trial 0 has speed_ms \"fast\", not a number"),
                        (lambda r: r["trials"][0].update(verdict="great"), "trial 0 has verdict \"great\""),
                        (lambda r: r["trials"].append({}), "trial 1 has no tau_approx"),
                        (lambda r: r["trials"][0].update(speed_ms=None), "trial 0 has speed_ms null, not a number"),
                        (lambda r: r["trials"][0].update(confirm_agreement=0.9), "without the other"),
                        (lambda r: r["trials"][0].update(tau_approx="0.1"), "trial 0 has knobs spice does not run")]:
        doc = json.loads(json.dumps(good))
        edit(doc["records"][0])
        path.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match="is not a tuned-settings file"):
            load_all(path)
        try:
            load_all(path)
        except ConfigError as e:
            assert words in str(e), (words, str(e))


def test_a_tune_whose_save_fails_at_the_end_prints_its_pick_and_ctrl_c_keeps_the_best_so_far(tiny_model, tmp_path,
                                                                                              capsys, monkeypatch):
    """Regression (review): a save that failed after the search (the --out file changed meanwhile) lost the pick, which
    was printed only after saving; and Ctrl-C mid-tune discarded every setting measured. The pick is printed first;
    the first Ctrl-C stops the search at its next check and prints the best so far, unsaved."""
    import os
    import signal

    import spice_core.tuned
    import spice_core.tuner
    from spice_core.errors import ConfigError

    from cli_helpers import run_cli

    small = ["tune", "--model", tiny_model, "--no-confirm", "--max-tokens", "16", "--n-prompts", "1", "--new-tokens",
             "2", "--shape", "deepseek-v2-lite"]

    def changed_meanwhile(record, path):
        raise ConfigError(f"{path} is not a tuned-settings file (ValueError: record 0: cache_frac is \"0.25\")")

    monkeypatch.setattr(spice_core.tuned, "save", changed_meanwhile)
    code, out, err = run_cli(capsys, [*small, "--out", tmp_path / "t.json"])
    assert code == 2 and out.startswith("recommended: --tau-approx ") and "the pick printed above could not be saved" \
        in err, (out, err)
    monkeypatch.undo()

    real_tune = spice_core.tuner.tune

    def ctrl_c_after_the_first_setting(*a, progress, **k):
        def progress_then_ctrl_c(msg, done, total):
            progress(msg, done, total)
            if done == 1:
                os.kill(os.getpid(), signal.SIGINT)        # the real signal, as a terminal sends it
        return real_tune(*a, progress=progress_then_ctrl_c, **k)

    monkeypatch.setattr(spice_core.tuner, "tune", ctrl_c_after_the_first_setting)
    out_file = tmp_path / "u.json"
    before = signal.getsignal(signal.SIGINT)
    code, out, err = run_cli(capsys, [*small, "--out", out_file])
    assert code == 130 and out.startswith("recommended: --tau-approx 0 ") and "stopped (Ctrl-C)" in err, (out, err)
    assert not out_file.exists() and signal.getsignal(signal.SIGINT) is before
