"""charlm.config.loading: the presets, YAML files and --set overrides read into a RunConfig, and
every error a config file or an override can give."""

import re
from pathlib import Path

import pytest

from charlm.config.loading import load_config, save_config
from charlm.config.schema import RunConfig
from charlm.config.yaml_files import dump_yaml, load_text, untext
from charlm.core.errors import CharlmError
from tests.helpers import ROOT

PRESETS = sorted((ROOT / "configs").glob("*.yaml"))


def test_presets_exist():
    names = {p.name for p in PRESETS}
    assert {"shakespeare_char.yaml", "shakespeare_char_cpu.yaml", "tiny.yaml"} <= names


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_preset_loads(preset):
    cfg = load_config(preset)
    assert isinstance(cfg, RunConfig)
    assert cfg.model.n_embd % cfg.model.n_head == 0


def test_baby_gpt_preset_matches_nanogpt():
    cfg = load_config(ROOT / "configs" / "shakespeare_char.yaml")
    m, o, t = cfg.model, cfg.optim, cfg.train
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.dropout) == (6, 6, 384, 256, 0.2)
    assert (t.batch_size, t.max_iters, o.lr, o.min_lr, o.warmup_iters, o.beta2) == (
        64, 5000, 1e-3, 1e-4, 100, 0.99)
    assert t.compile and t.dtype == "auto"  # nanoGPT compiles and trains in bf16 on a GPU


def test_defaults_are_gpt2_on_the_cpu_presets_shape():
    """The built-in defaults (`charlm train my.txt`) keep GPT-2's architecture, so their models
    export to transformers; the CPU preset is smaller (2 x 96) with RoPE, SwiGLU and a shorter
    schedule at a higher lr (README, Configuration), kept on the cosine its figures were
    measured with (the defaults decay warmup-stable-decay), and nothing else differs."""
    defaults = load_config(None)
    preset = load_config(ROOT / "configs" / "shakespeare_char_cpu.yaml")
    assert (defaults.model.pos_encoding, defaults.model.activation) == ("learned", "gelu")
    assert defaults.data.path == preset.data.path == "data/tinyshakespeare.txt"
    changed = {(section, key) for section, values in preset.to_dict().items()
               for key, value in values.items() if defaults.to_dict()[section][key] != value}
    assert changed == {("model", "n_layer"), ("model", "n_embd"), ("model", "pos_encoding"),
                       ("model", "activation"), ("optim", "lr"), ("optim", "min_lr"),
                       ("optim", "warmup_iters"), ("optim", "schedule"), ("train", "max_iters"),
                       ("train", "eval_interval"), ("train", "out_dir")}


def test_the_defaults_run_dir_is_named_after_the_data_and_is_no_presets():
    """`charlm train` with no arguments trained the defaults into runs/shakespeare_char_cpu, the
    run dir of the preset of that name (scripts/demo.sh), for another model: the one refused the
    other's run, or with --overwrite removed it. A config that names no run dir now trains into
    runs/<name of data.path>, fixed when the config is read, so config.yaml holds it."""
    defaults = load_config(None)
    assert RunConfig().train.out_dir == defaults.train.out_dir == "runs/tinyshakespeare"
    presets = {load_config(preset).train.out_dir for preset in PRESETS}
    assert defaults.train.out_dir not in presets
    assert load_config(ROOT / "configs" / "shakespeare_char_cpu.yaml").train.out_dir == (
        "runs/shakespeare_char_cpu")  # scripts/demo.sh's


def test_a_config_without_a_run_dir_names_it_after_its_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write(tmp_path, "data:\n  path: corpora/cmudict.tsv\ntrain:\n  max_iters: 3\n")
    cfg = load_config(config)
    assert cfg.train.out_dir == str(Path("runs", "cmudict"))
    assert load_config(config, ["train.out_dir=mine"]).train.out_dir == "mine"
    assert load_config(config, ["train.out_dir=null"]).train.out_dir == str(Path("runs", "cmudict"))
    assert load_config(None, ["data.path=."]).train.out_dir == str(Path("runs", tmp_path.name))
    save_config(cfg, tmp_path / "saved.yaml")  # what a run dir's config.yaml and a resume read
    assert "out_dir: runs/cmudict\n" in (tmp_path / "saved.yaml").read_text()
    assert load_config(tmp_path / "saved.yaml", ["data.path=other.txt"]).train.out_dir == (
        str(Path("runs", "cmudict")))
    with pytest.raises(CharlmError) as e:
        load_config(None, ["data.path=/"])
    assert str(e.value) == ("invalid config value train.out_dir: data.path '/' has no name to call "
                            "the run dir after; set train.out_dir (or --out)")
    with pytest.raises(CharlmError, match="train.out_dir: must not be empty"):
        load_config(None, ["train.out_dir=''"])


def write(tmp_path, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_unknown_key_suggests_nearest(tmp_path):
    path = write(tmp_path, "model:\n  n_layers: 3\n")
    with pytest.raises(CharlmError) as e:
        load_config(path)
    assert str(e.value) == f"unknown key 'model.n_layers' in {path}, did you mean 'n_layer'?"


def test_unknown_section_suggests_nearest(tmp_path):
    path = write(tmp_path, "optimizer:\n  lr: 0.1\n")
    with pytest.raises(CharlmError, match=r"unknown section 'optimizer' .* did you mean 'optim'"):
        load_config(path)


def test_wrong_type_says_what_is_allowed(tmp_path):
    with pytest.raises(CharlmError) as e:
        load_config(write(tmp_path, "model:\n  n_layer: four\n"))
    assert "invalid value for model.n_layer" in str(e.value)
    assert "'four', expected an integer" in str(e.value)
    with pytest.raises(CharlmError, match="expected true/false"):
        load_config(None, ["model.bias=1"])
    with pytest.raises(CharlmError) as e:
        load_config(None, ["train.device=gpu"])
    assert str(e.value) == ("invalid config value train.device: unknown device 'gpu'; use auto, "
                            "cpu, cuda, cuda:N or mps")
    assert load_config(None, ["train.device=cuda:1"]).train.device == "cuda:1"


@pytest.mark.parametrize("override, message", [
    ("model.n_embd=130", "130 is not divisible by model.n_head=4"),
    ("optim.lr=0", "invalid config value optim.lr: 0.0 must be > 0"),
    ("optim.lr=-1e-3", "must be > 0"),
    ("model.dropout=1.0", "model.dropout: 1.0 is outside [0, 1)"),
    ("model.dropout=-0.1", "is outside [0, 1)"),
    ("model.label_smoothing=1", "model.label_smoothing: 1.0 is outside [0, 1)"),
    ("train.batch_size=0", "train.batch_size: must be >= 1"),
    ("data.val_fraction=1.5", "data.val_fraction: 1.5 is outside (0, 1)"),
    ("optim.lr=.inf", "invalid value for optim.lr in --set overrides: inf, expected a finite "
     "number"),
    ("optim.weight_decay=1e999", "optim.weight_decay in --set overrides: 1e999 is a number too"),
    ("optim.grad_clip=.nan", "optim.grad_clip in --set overrides: nan, expected a finite"),
    ("train.threads=0", "invalid config value train.threads: 0 must be `auto` or a number >= 1"),
    ("train.threads=many", "train.threads: 'many' must be `auto` or a number >= 1"),
    ("train.threads=yes", "train.threads: 'yes' must be `auto` or a number >= 1"),
])
def test_impossible_values_rejected(override, message):
    with pytest.raises(CharlmError) as e:
        load_config(None, [override])
    assert message in str(e.value)


def test_lr_below_the_default_min_lr_says_to_set_min_lr():
    """`--set optim.lr=3e-4`, the README's example, failed with the defaults' min_lr 4e-4 and an
    error that did not say what to do; the example is now valid and the error names the fix."""
    with pytest.raises(CharlmError) as e:
        load_config(None, ["optim.lr=3e-4"])
    assert str(e.value) == ("invalid config value optim.min_lr: 0.0004 must be in [0, lr], and lr "
                            "is 0.0003; set optim.min_lr to at most lr, e.g. lr / 10 = 3e-05")
    assert load_config(None, ["optim.lr=3e-4", "optim.min_lr=3e-05"]).optim.min_lr == 3e-5
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = re.search(r"\(`(--set optim\.lr=\S+ --set model\.n_ff=null)`\)", readme)[1]
    assert load_config(None, re.findall(r"--set (\S+)", example)).optim.lr == 1e-3


def test_overrides_take_precedence_and_parse_as_yaml(tmp_path):
    path = write(tmp_path, "optim:\n  lr: 3e-4\ntrain:\n  max_iters: 7\n")
    cfg = load_config(path, ["train.max_iters=9", "model.n_ff=null", "optim.min_lr=1e-5"])
    assert cfg.optim.lr == 3e-4  # YAML 1.2 float syntax is a number, not a string
    assert cfg.train.max_iters == 9
    assert cfg.model.n_ff is None and cfg.model.ff_width == 4 * cfg.model.n_embd
    assert cfg.optim.min_lr == 1e-5
    assert cfg.train.batch_size == RunConfig().train.batch_size  # untouched default


def test_numbers_are_read_as_yaml_1_2_reads_them(tmp_path):
    """PyYAML (YAML 1.1) read `010` as octal 8 and `1:30` as the base-60 number 90, so
    `--set train.seed=0042` trained with seed 34 and `out_dir: 1:30` was refused as the integer
    90; YAML 1.2, whose floats the loader already used, reads 10 and the string '1:30'."""
    cfg = load_config(write(tmp_path, "model:\n  n_layer: 010\ntrain:\n  seed: 0o17\n"
                                      "  out_dir: 1:30\n  max_iters: 0x10\n"),
                      ["optim.warmup_iters=0042", "data.path=12:30:05"])
    assert (cfg.model.n_layer, cfg.train.seed, cfg.train.out_dir, cfg.train.max_iters) == (
        10, 15, "1:30", 16)
    assert (cfg.optim.warmup_iters, cfg.data.path) == (42, "12:30:05")
    with pytest.raises(CharlmError) as e:
        load_config(None, ["train.max_iters=1:30"])
    assert str(e.value) == ("invalid value for train.max_iters in --set overrides: '1:30', "
                            "expected an integer")


def test_set_without_equals():
    with pytest.raises(CharlmError) as e:
        load_config(None, ["optim.lr"])
    assert str(e.value) == (
        "--set expects section.key=value, got 'optim.lr' (e.g. --set optim.lr=1e-3)")


def test_set_key_given_twice_is_an_error():
    """The later value used to win silently; a YAML key given twice is an error too."""
    with pytest.raises(CharlmError) as e:
        load_config(None, ["optim.lr=1e-3", "train.max_iters=5", " optim.lr = 2e-3"])
    assert str(e.value) == "--set optim.lr is given twice; give it once"


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    path = write(tmp_path, "model:\n  n_layer: : 3\n")
    with pytest.raises(CharlmError) as e:
        load_config(path)
    assert str(e.value) == (
        f"YAML syntax error in {path} at line 2, column 12: mapping values are not allowed here")


def test_yaml_tab_says_to_indent_with_spaces(tmp_path):
    path = write(tmp_path, "model:\n\tn_layer: 2\n")
    with pytest.raises(CharlmError) as e:
        load_config(path)
    assert str(e.value) == (f"YAML syntax error in {path} at line 2, column 1: found character "
                            "'\\t' that cannot start any token; YAML indents with spaces, not tabs")


@pytest.mark.parametrize("text, where", [
    ("optim:\n  lr: 1.0e-3\n  lr: 5.0e-3\n", "line 3, column 3: duplicate key 'lr'"),
    ("optim:\n  lr: 1.0e-3\ntrain:\n  seed: 1\noptim:\n  min_lr: 0\n",
     "line 5, column 1: duplicate key 'optim'"),
])
def test_yaml_duplicate_key_is_an_error(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(CharlmError) as e:
        load_config(path)
    assert str(e.value) == f"YAML syntax error in {path} at {where}"


def test_yaml_not_a_mapping(tmp_path):
    with pytest.raises(CharlmError, match="must hold a mapping of sections .* got list"):
        load_config(write(tmp_path, "- 1\n- 2\n"))


def test_missing_config_file(tmp_path):
    with pytest.raises(CharlmError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("path", ["1e5", "2.5E-3", "yes", "null", "010", "1:00", "~", "08",
                                  ".nan", "-.inf", "0o17", " lead", "trail ", "a\nb",
                                  "my \U0001f600.txt", "caf\u00e9 \"x\": 1 'y' #z", "- a",
                                  "[x]", "{a: b}", "&a *b", "x" * 30 + "  " + "y " * 60])
def test_saved_config_loads_back_whatever_its_strings_look_like(tmp_path, path):
    """A run's config.yaml (and the config `charlm info` prints) used to write the string '1e5'
    plain, which the loader reads as the float 1e5 (YAML 1.2 floats): a run on a text file named
    1e5 could not be trained again from its config.yaml."""
    cfg = load_config(None, [("data.path", path), ("train.out_dir", path)])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    assert untext(load_text(dump_yaml(cfg.to_dict()))) == cfg.to_dict()


def test_plain_scalars_are_read_by_their_fields_type(tmp_path):
    """A plain scalar is read by its field's grammar: `08` is a path, not a failed octal;
    `1` for a float is 1.0; YAML 1.1's yes/on are bools; ~ and an empty value are null."""
    cfg = load_config(write(tmp_path, "model:\n  bias: yes\n  tie_weights: Off\n  n_ff: ~\n"
                                      "  dropout: 0\noptim:\n  lr: 1\n  lr_decay_iters:\n"
                                      "  min_lr: 1_0e-2_0\ndata:\n  path: 08\n"
                                      "train:\n  out_dir: true\n  seed: -0x_1f\n"))
    assert (cfg.model.bias, cfg.model.tie_weights, cfg.model.n_ff, cfg.model.dropout) == (
        True, False, None, 0.0)
    assert (cfg.optim.lr, type(cfg.optim.lr), cfg.optim.lr_decay_iters, cfg.optim.min_lr) == (
        1.0, float, None, 1e-19)
    assert (cfg.data.path, cfg.train.out_dir, cfg.train.seed) == ("08", "true", -31)


@pytest.mark.parametrize("text, message", [
    ('model:\n  n_layer: "10"\n', "model.n_layer in {path}: '10', expected an integer"),
    ("model:\n  n_layer: 0X10\n", "model.n_layer in {path}: '0X10', expected an integer"),
    ("model:\n  n_layer: _1\n", "model.n_layer in {path}: '_1', expected an integer"),
    ("model:\n  n_layer: 1.0\n", "model.n_layer in {path}: 1.0, expected an integer"),
    ("model:\n  n_layer: [1, 2]\n", "model.n_layer in {path}: [1, 2], expected an integer"),
    ("model:\n  bias: 1\n", "model.bias in {path}: 1, expected true/false"),
    ("model:\n  norm: 1e3\n", "model.norm in {path}: 1000.0, expected one of 'layernorm', "
     "'rmsnorm'"),
    ("data:\n  path: null\n", "data.path in {path}: None, expected a string or a list, each "
     "item a string"),
    ("data:\n  path:\n", "data.path in {path}: None, expected a string or a list, each item a "
     "string"),
    ("optim:\n  lr: inf\n", "optim.lr in {path}: 'inf', expected a number"),
    ("optim:\n  lr: -.Inf\n", "optim.lr in {path}: -inf, expected a finite number"),
    ("model:\n  n_ff: .NaN\n", "model.n_ff in {path}: nan, expected an integer or null"),
])
def test_values_that_do_not_fit_their_field_are_named_as_yaml_reads_them(tmp_path, text,
                                                                         message):
    """A quoted number is a string, as it was when the loader typed the YAML itself; a value
    that fits no grammar of its field is shown as YAML reads it (1.0, not '1.0')."""
    path = write(tmp_path, text)
    with pytest.raises(CharlmError) as e:
        load_config(path)
    assert str(e.value) == "invalid value for " + message.format(path=path)


def test_a_file_or_section_that_is_no_mapping_is_named_by_its_yaml_type(tmp_path):
    for text, message in (("5\n", "must hold a mapping of sections (model, optim, train, data),"
                                   " got int"),
                          ("model: 1.5\n", "section 'model' in {path} must be a mapping of "
                                            "keys, got float")):
        path = write(tmp_path, text)
        with pytest.raises(CharlmError) as e:
            load_config(path)
        assert str(e.value).endswith(message.format(path=path))
    assert load_config(write(tmp_path, "model:\n")) == RunConfig()


def test_yaml_merge_keys_still_merge(tmp_path):
    cfg = load_config(write(tmp_path, "model: &m {n_layer: 3}\noptim:\n  <<: {lr: 0.5}\n"))
    assert (cfg.model.n_layer, cfg.optim.lr) == (3, 0.5)


def test_option_values_are_taken_as_given_and_set_text_as_yaml():
    """A (key, value) override, as --data / --out / --device give, is the exact string; a
    `--set key=text` is read as the same text in a YAML file is."""
    cfg = load_config(None, [("data.path", "null"), ("train.out_dir", "a: 'b'\n"),
                             "optim.lr=0x1", "model.n_ff=", "train.device= cpu"])
    assert (cfg.data.path, cfg.train.out_dir) == ("null", "a: 'b'\n")
    assert (cfg.optim.lr, cfg.model.n_ff, cfg.train.device) == (1.0, None, "cpu")
    with pytest.raises(CharlmError) as e:
        load_config(None, ["data.path=null"])
    assert str(e.value) == ("invalid value for data.path in --set overrides: None, expected a "
                            "string or a list, each item a string")
    with pytest.raises(CharlmError) as e:
        load_config(None, [("optim.lr", "1e-3"), "optim.lr=1e-3"])
    assert str(e.value) == "--set optim.lr is given twice; give it once"
    assert untext(load_text("a: [1, '1', 1.5, yes, ~]")) == {"a": [1, "1", 1.5, True, None]}


def alias_bomb(levels: int) -> str:
    """A "billion laughs" inside a config value: each level ten aliases of the one below."""
    text = "model:\n  bias:\n  - &a0 [x, x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, levels + 1):
        text += f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n"
    return text


@pytest.mark.parametrize("levels", [3, 6, 9])
def test_an_alias_bomb_is_one_short_error(tmp_path, levels):
    """Six levels hung `charlm info` and `train`; three gave a 58 KB error line (the value
    expanded in full)."""
    path = write(tmp_path, alias_bomb(levels))
    with pytest.raises(CharlmError) as e:
        load_config(path)
    assert str(e.value) == (f"YAML syntax error in {path} at line 6, column 5: aliases expand to "
                            "more than 10,000 values")


def test_yaml_nested_deeper_than_a_config_is_one_error(tmp_path):
    """600 levels ended in a RecursionError traceback from PyYAML's parser."""
    for depth in (40, 600):
        path = write(tmp_path, "model:\n  n_layer: " + "[" * depth + "]" * depth + "\n")
        with pytest.raises(CharlmError) as e:
            load_config(path)
        assert str(e.value).startswith(f"YAML syntax error in {path}")
        assert str(e.value).endswith("values nested more than 32 levels deep")


def test_a_long_bad_value_is_cut_in_its_error(tmp_path):
    path = write(tmp_path, "model:\n  n_layer: [" + ", ".join(["x"] * 2000) + "]\n")
    with pytest.raises(CharlmError) as e:
        load_config(path)
    assert str(e.value) == (f"invalid value for model.n_layer in {path}: " + repr(["x"] * 2000)[:80]
                            + "... (10,000 characters), expected an integer")


def test_train_threads_is_auto_or_a_count():
    assert load_config(None, []).train.threads == "auto"
    assert load_config(None, ["train.threads=2"]).train.threads == 2
