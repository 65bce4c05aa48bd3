//! The user guide's reference of the spec files (`docs/src/reference/specs/*.md`) is generated
//! from the types the loaders parse (their doc comments and serde attributes, through
//! `schemars`): this test regenerates the pages and fails when the committed ones differ, and
//! with `FAULTLINE_BLESS=1` writes them. It also checks that every shipped spec file loads
//! and that every field name it uses is on its page.

#[path = "spec_reference/render.rs"]
mod render;

use faultline_fault::explore::ExploreSpec;
use faultline_fault::protect::ProtectionPlan;
use faultline_fault::CampaignSpec;
use faultline_graph::spec::ModelSpec;
use faultline_hw::HwConfig;
use render::Page;
use schemars::schema::RootSchema;
use schemars::JsonSchema;
use std::fs;
use std::path::{Path, PathBuf};

const COMMAND: &str = "FAULTLINE_BLESS=1 cargo test -p faultline-cli --test spec_reference";
/// Where the pages go, from the repository root.
const PAGES_DIR: &str = "docs/src/reference/specs";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const HARDWARE: &str = "\
A hardware config describes one simulated machine: its systolic array (MXU), vector unit (VPU), \
on-chip SRAMs, off-chip DRAM and DMA engine. The shipped ones are `configs/tpu-*.ron`; commands \
take one as `--config FILE` (`faultline gemm`, `op`, `sites`, `train`, `program`), and a campaign \
names one in its `hw` field. Every field is required and unknown fields are refused, so a typo is \
an error rather than a silent default; the loader checks each range below and names the file, \
field, value and allowed range when a value is out of it.

RON in brief: a file holds one struct, `(field: value, ...)`; nested structs are written the same \
way (`mxu: (rows: 32, cols: 32, ...)`); an enum value is its variant's name, bare \
(`dataflow: WeightStationary`, `input_format: Bf16`); `f64` numbers may be written with a decimal \
point (`940.0`), and `inf` is infinity; comments start with `//`.";

const MODEL: &str = "\
A model file defines a network to train: its per-example input shape, its output width, its loss \
and a list of layers. The shipped ones are `models/*.ron`; `faultline train --model FILE` and \
`faultline program --model FILE` take one, and a campaign names one in its `model` field. Unknown \
fields are refused. A layer reads the previous layer unless it lists `inputs` (`input` names the \
model input); the last layer's output, `[batch, outputs]`, feeds the loss. Shapes and the ranges \
below are checked when the model is built for a run, and errors name the file and the layer.

RON in brief: a file holds one struct, `(field: value, ...)`, and each layer is one too; a layer's \
`op` is a variant name, bare when it has no fields (`op: Relu`) and with its fields in \
parentheses otherwise (`op: Dense(units: 64)`, `op: Conv2d(filters: 8, kernel: 3, padding: 1)`); \
fields with a default may be left out; lists are `[a, b]`, strings `\"...\"`, comments `//`.";

const CAMPAIGN: &str = "\
A campaign file defines a fault-injection campaign: a model trained on a machine, the training \
steps (or inference batches) faults strike in, the fault-site classes, what one fault does, and \
how trials are drawn. The shipped ones are `configs/campaign-*.ron`; run one with \
`faultline campaign FILE --out DIR`. Paths in it (`model`, `hw`, `protection`, `train.data`) are \
relative to the campaign file's directory. Unknown fields are refused, and the loader checks \
every range below before anything runs, naming the file, field, value and allowed values.

RON in brief: a file holds one struct, `(field: value, ...)`, optionally named \
(`CampaignSpec(...)`). An enum value is its variant's name: bare for a variant without a value \
(`fault: Flip`, `sampling: Exhaustive`, `mode: Inference`), with its named fields in parentheses \
(`sampling: Uniform(n: 2000)`, `inject_steps: Range(first: 10, last: 20)`), or with its one value \
in parentheses (`inject_steps: List([20])`, `lasts: Cycles(4)`). A field shown as `T or none` is \
an option, written `Some(0.001)` or `None`, not as the bare value. Optimizer and precision names \
are lower-case (`optimizer: adam`, `precision: Some(fp32)`). Nested structs whose fields all have \
defaults may list only some of them (`train: (batch: 32, seed: 1)`).";

const PROTECTION: &str = "\
A protection plan lists the mechanisms that guard a campaign's machine and training step (check \
codes on site classes, ABFT checksums of matrix multiplies, range checks, duplication, clamps, \
and He et al.'s training checks) and what a detection triggers. The shipped ones are \
`configs/protect-*.ron`; a campaign runs under one with `faultline campaign FILE --protect PLAN \
--out DIR` (or names it in its `protection` field), and an exploration compares several. Globs in \
`on` select site classes as `faultline sites` prints them; globs in `nodes` select graph nodes as \
`faultline program` names them. A glob that selects nothing is an error that lists what it could \
have selected. Learned thresholds and bounds are calibrated on the campaign's golden run.

RON in brief: a file holds one struct, `(field: value, ...)`; `mechanisms` is a list of enum \
variants, each bare when it has no value (`NonFiniteLoss`), with its one value in parentheses \
(`MomentBound(20.0)`, `tile: ByIntensity(8.0)`, `bound: Learned(2.0)`, `recovery: Reexecute(2)`), \
or with its named fields (`Ecc(code: Secded, on: [\"ub.word[*]\"])`). A field shown as \
`T or none` is an option, written `Some(Rows)` or left out.";

const EXPLORE: &str = "\
An exploration runs every listed protection plan against each listed campaign on the same trials \
and measures each plan's residual failure rate, check bits, cycle overhead and false positives: \
the data of the Pareto report. The shipped one is `configs/explore-mlp.ron`; run it with \
`faultline explore FILE --out DIR`. Campaign and plan paths are relative to the exploration \
file's directory; each is loaded and checked, every campaign under every plan, before any run \
starts.

RON in brief: a file holds one struct, `(field: value, ...)`, optionally named \
(`ExploreSpec(...)`); lists of paths are `[\"a.ron\", \"b.ron\"]`; unlike a campaign's, \
`fit_per_bit` here is a plain number (`0.001`), not an option.";

/// One generated page: its file name, the root type's schema and name, and its text around
/// the tables.
struct Spec {
    file: &'static str,
    schema: RootSchema,
    root: String,
    title: &'static str,
    intro: &'static str,
    example: &'static str,
}

fn spec<T: JsonSchema>(file: &'static str, title: &'static str, intro: &'static str, example: &'static str) -> Spec {
    Spec { file, schema: schemars::schema_for!(T), root: T::schema_name(), title, intro, example }
}

fn specs() -> Vec<Spec> {
    vec![
        spec::<HwConfig>("hardware.md", "Hardware configs", HARDWARE, "configs/tpu-32x32.ron"),
        spec::<ModelSpec>("model.md", "Model files", MODEL, "models/mlp-digits.ron"),
        spec::<CampaignSpec>("campaign.md", "Campaign files", CAMPAIGN, "configs/campaign-mlp-mxu.ron"),
        spec::<ProtectionPlan>("protection.md", "Protection plans", PROTECTION, "configs/protect-all.ron"),
        spec::<ExploreSpec>("explore.md", "Exploration files", EXPLORE, "configs/explore-mlp.ron"),
    ]
}

fn generate(s: &Spec) -> String {
    let example = fs::read_to_string(repo().join(s.example)).expect("example file");
    let page = Page { title: s.title, intro: s.intro, example: (s.example, &example), command: COMMAND };
    render::page(&s.schema, &s.root, &page)
}

#[test]
fn spec_reference_pages_match_the_code() {
    let bless = std::env::var("FAULTLINE_BLESS").is_ok_and(|v| !v.is_empty() && v != "0");
    let dir = repo().join(PAGES_DIR);
    let mut stale = Vec::new();
    for s in specs() {
        let text = generate(&s);
        let path = dir.join(s.file);
        if bless {
            fs::create_dir_all(&dir).unwrap();
            fs::write(&path, &text).unwrap();
        } else if fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            stale.push(format!("{PAGES_DIR}/{}", s.file));
        }
    }
    assert!(
        stale.is_empty(),
        "{}: out of date with the spec types' doc comments and serde attributes (or missing); \
         run `{COMMAND}` to update, and commit the result",
        stale.join(", "),
    );
}

/// Every field name used anywhere in `v` (struct fields, and struct variants' fields).
fn field_names(v: &ron::Value, out: &mut Vec<String>) {
    match v {
        ron::Value::Map(m) => {
            for (k, v) in m.iter() {
                if let ron::Value::String(k) = k {
                    out.push(k.clone());
                }
                field_names(v, out);
            }
        }
        ron::Value::Seq(items) => items.iter().for_each(|x| field_names(x, out)),
        ron::Value::Option(Some(x)) => field_names(x, out),
        _ => {}
    }
}

/// The page documenting a shipped spec file, by its name, after loading it with its loader;
/// `None` for a file that is not a spec (the SCALE-Sim `.cfg`).
fn load(path: &Path) -> Option<&'static str> {
    let name = path.file_name().unwrap().to_str().unwrap();
    let dir = path.parent().unwrap().file_name().unwrap();
    let page = match name {
        _ if !name.ends_with(".ron") => return None,
        _ if dir == "models" => ModelSpec::load(path).map(|_| "model.md").map_err(|e| e.to_string()),
        _ if name.starts_with("tpu-") => HwConfig::load(path).map(|_| "hardware.md").map_err(|e| e.to_string()),
        _ if name.starts_with("campaign-") => {
            CampaignSpec::load(path).map(|_| "campaign.md").map_err(|e| e.to_string())
        }
        _ if name.starts_with("protect-") => {
            ProtectionPlan::load(path).map(|_| "protection.md").map_err(|e| e.to_string())
        }
        _ if name.starts_with("explore-") => ExploreSpec::load(path).map(|_| "explore.md").map_err(|e| e.to_string()),
        _ => panic!("{}: a spec file of no known kind: give it a reference page", path.display()),
    };
    Some(page.unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

#[test]
fn every_field_of_the_shipped_spec_files_is_on_its_page() {
    let pages: Vec<(&str, String)> = specs().iter().map(|s| (s.file, generate(s))).collect();
    let mut files: Vec<PathBuf> = ["configs", "models"]
        .iter()
        .flat_map(|d| fs::read_dir(repo().join(d)).unwrap().map(|e| e.unwrap().path()))
        .collect();
    files.sort();
    let mut checked = 0;
    for path in files {
        let Some(page) = load(&path) else { continue };
        let text = &pages.iter().find(|(f, _)| *f == page).unwrap().1;
        let value: ron::Value = ron::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
        let mut names = Vec::new();
        field_names(&value, &mut names);
        assert!(!names.is_empty(), "{}: no fields read", path.display());
        for n in names {
            assert!(text.contains(&format!("| `{n}` |")), "{}: field `{n}` is not in {page}", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} spec files found");
}

/// The limits the doc comments state are written out as numbers; where the loader checks a
/// named constant, the page must state that constant's value, so changing one without the
/// other fails here.
#[test]
fn limits_on_the_pages_are_the_loaders_constants() {
    use faultline_fault::spec::{MAX_DIR_NAME, MAX_FIT_PER_BIT, MAX_TRIALS};
    use faultline_hw::config::{CLOCK_MHZ, DRAM_BANDWIDTH, MAX_ARRAY_DIM, MAX_FIXED_CYCLES, NAME_MAX_CHARS};
    use faultline_train::trainer::{OptimizerKind, MAX_STEPS};
    let page = |file: &str| generate(&specs().into_iter().find(|s| s.file == file).unwrap());
    let (hardware, campaign, protection, explore) =
        (page("hardware.md"), page("campaign.md"), page("protection.md"), page("explore.md"));
    let lrs = [OptimizerKind::Sgd, OptimizerKind::Momentum, OptimizerKind::Adam]
        .map(|k| format!("{} {}", k.name(), k.default_lr()))
        .join(", ");
    let stated = [
        (&campaign, format!("Trials, 1..={MAX_TRIALS}.")),
        (&campaign, format!("Trials per class, 1..={MAX_TRIALS}.")),
        (&campaign, format!("Steps, 1..={MAX_STEPS} ")),
        (&campaign, format!("0..={MAX_FIT_PER_BIT:e}, or `None`")),
        (&campaign, format!("1 to {MAX_DIR_NAME} of")),
        (&campaign, format!("default ({lrs})")),
        (&protection, format!("1 to {MAX_DIR_NAME} of")),
        (&explore, format!("positive, at most {MAX_FIT_PER_BIT:e}.")),
        (&explore, format!("1 to {MAX_DIR_NAME} of")),
        (&hardware, format!("1..={NAME_MAX_CHARS} characters")),
        (&hardware, format!("{}..={} (1 MHz", CLOCK_MHZ.start(), CLOCK_MHZ.end())),
        (&hardware, format!("Count, 1..={MAX_ARRAY_DIM}.")),
        (&hardware, format!("{}..=2^20 ({})", DRAM_BANDWIDTH.start(), DRAM_BANDWIDTH.end())),
        (&hardware, format!("Cycles, 0..={MAX_FIXED_CYCLES}.")),
    ];
    for (text, phrase) in stated {
        assert!(text.contains(&phrase), "no page states `{phrase}`: update the doc comment to the loader's limit");
    }
}
