//! A campaign directory on disk (`campaign.json`, `records.jsonl`, `summary.json`,
//! `timing.jsonl`, `shard.json`): the one place that opens, checks, resumes and merges it.
//!
//! * **One writer**: a run or merge holds the directory's lock ([`DirLock`]) while it writes.
//! * **Identified**: `campaign.json` is read with its identity ([`CampaignInfo::identity`]),
//!   and a record line of another campaign is refused by every reader ([`check_identity`]).
//! * **Bounded**: `campaign.json` and `shard.json` are capped text, records and timing are
//!   streamed line by line; no reader holds a directory's records in memory.
//! * **Never half-written**: whole files are written to a temporary and renamed.

use crate::campaign::{Next, Rounds, RunOptions, Shard};
use crate::error::{FaultError, Result};
use crate::record::{summarize, CampaignInfo, RecordKey, Summary, SCHEMA};
use crate::Outcome;
use faultline_hw::files::{read_text_capped, DirLock, JsonLines, TEXT_FILE_LIMIT};
use serde::{Deserialize, Serialize};
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// `campaign.json` as read: its text (resuming and merging compare it byte for byte), the
/// parsed description and its identity.
#[derive(Debug, Clone)]
pub struct InfoFile {
    /// The file's text.
    pub text: String,
    /// The campaign it describes.
    pub info: CampaignInfo,
    /// [`CampaignInfo::identity`] of `info`.
    pub id: String,
}

/// Reads `dir/campaign.json`: a regular file of at most 16 MiB, of this schema, whose sizes a
/// reader may allocate by.
pub fn read_info(dir: &Path) -> Result<InfoFile> {
    let path = dir.join("campaign.json");
    let text = read_text_capped(&path, TEXT_FILE_LIMIT).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => FaultError::Output {
            path: path.clone(),
            why: "missing: is this a campaign's --out directory (`faultline campaign SPEC --out DIR`)?".into(),
        },
        _ => FaultError::io(&path)(e),
    })?;
    let bad = |why: String| FaultError::Output { path: path.clone(), why };
    #[derive(Deserialize)]
    struct Version {
        schema: u32,
    }
    let v: Version = serde_json::from_str(&text).map_err(|e| bad(format!("not a campaign description: {e}")))?;
    if v.schema != SCHEMA {
        return Err(bad(format!(
            "schema {} (this faultline reads schema {SCHEMA}): re-run the campaign with this version",
            v.schema
        )));
    }
    let info: CampaignInfo =
        serde_json::from_str(&text).map_err(|e| bad(format!("not a campaign description: {e}")))?;
    info.check_sizes().map_err(bad)?;
    let id = info.identity();
    Ok(InfoFile { text, info, id })
}

/// Refuses line `line` of the records file `path` if the campaign it names (`got`) is not
/// `id`, the identity of the `campaign.json` beside it.
pub fn check_identity(path: &Path, line: u64, got: &str, id: &str) -> Result<()> {
    if got == id {
        return Ok(());
    }
    Err(FaultError::Output {
        path: path.into(),
        why: format!(
            "line {line}: a record of campaign {:?}, but campaign.json beside it is campaign {id:?}: records of \
             another campaign (another seed, spec, machine or plan) were mixed in",
            faultline_hw::error::one_line(got)
        ),
    })
}

/// The fields every reader checks first: which campaign wrote the line, and its trial.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    campaign: std::borrow::Cow<'a, str>,
    trial: u64,
}

/// The trial id of a timing line (`{"trial":T,"wall_us":U,...}`), `None` if it is not one.
fn timing_trial(line: &str) -> Option<u64> {
    #[derive(Deserialize)]
    struct Timing {
        trial: u64,
        #[allow(dead_code)] // a line without it is not a timing line
        wall_us: u64,
    }
    serde_json::from_str::<Timing>(line).ok().map(|t| t.trial)
}

/// Pretty JSON with a final newline.
pub(crate) fn json_text<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).expect("campaign files serialise") + "\n"
}

/// Writes `text` to `path` through a temporary file and a rename, so a reader never sees half.
pub(crate) fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).map_err(FaultError::io(&tmp))?;
    fs::rename(&tmp, path).map_err(FaultError::io(path))
}

/// Writes `path` line by line through a temporary file and a rename (`fill` writes the lines).
fn write_streamed(path: &Path, fill: impl FnOnce(&mut BufWriter<File>) -> Result<()>) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut w = BufWriter::new(File::create(&tmp).map_err(FaultError::io(&tmp))?);
    fill(&mut w)?;
    w.into_inner().map_err(|e| FaultError::io(&tmp)(e.into_error()))?.sync_data().map_err(FaultError::io(&tmp))?;
    fs::rename(&tmp, path).map_err(FaultError::io(path))
}

/// Opens a JSONL file of a campaign directory (`None` if absent), naming it in errors.
fn open_lines(path: &Path) -> Result<Option<JsonLines>> {
    JsonLines::open_if_exists(path).map_err(FaultError::io(path))
}

/// What [`scan_records`] found in a records file.
struct Scan {
    /// Lines in the file, a cut last one included.
    lines: u64,
    /// Leading lines that are complete records of the expected trials, in order.
    in_order: u64,
    /// Bytes of the file those leading lines take.
    in_order_end: u64,
}

/// Streams the records file `path` (absent: empty), refusing any record of a campaign other
/// than `id`, and counts how many leading lines are complete records of `expected`'s trials
/// in order (what a resume keeps and a merge requires of a whole shard).
fn scan_records(path: &Path, mut expected: impl Iterator<Item = u64>, id: &str) -> Result<Scan> {
    let mut scan = Scan { lines: 0, in_order: 0, in_order_end: 0 };
    let Some(mut lines) = open_lines(path)? else { return Ok(scan) };
    let mut ordered = true;
    while let Some(l) = lines.next_line().map_err(FaultError::io(path))? {
        let head = serde_json::from_str::<Head>(l.text).ok().filter(|_| l.complete);
        if let Some(h) = &head {
            check_identity(path, l.number, &h.campaign, id)?;
        }
        // A kill leaves at most a cut last line; anything else out of order is re-run.
        ordered &= head.is_some_and(|h| Some(h.trial) == expected.next());
        scan.lines += 1;
        if ordered {
            scan.in_order += 1;
            scan.in_order_end = l.end;
        }
    }
    Ok(scan)
}

/// Locks `out` and prepares it for a run of campaign `info` (whose `campaign.json` text is
/// `info_text`, identity `id`); returns the lock, held for the run, and the number of this
/// shard's trials already recorded. A fresh directory gets `campaign.json` (and `shard.json`
/// for a slice); `--resume` checks both match, keeps the records that are this shard's first
/// trials in order (cutting a half-written last line and anything after a gap), refuses a
/// record of another campaign anywhere in the file, and keeps the timing lines of kept trials
/// (a corrupt timing line is dropped: it holds only a wall time).
pub(crate) fn open_output(out: &Path, info: &CampaignInfo, id: &str, opts: RunOptions) -> Result<(DirLock, usize)> {
    let lock = DirLock::acquire(out).map_err(FaultError::io(out))?;
    let info_text = json_text(info);
    let info_path = out.join("campaign.json");
    let shard_path = out.join("shard.json");
    let shard_text = (opts.shard != Shard::ALL).then(|| json_text(&opts.shard));
    let records_path = out.join("records.jsonl");
    if info_path.exists() {
        if !opts.resume {
            return Err(FaultError::Output {
                path: out.into(),
                why: "holds a campaign already: pass --resume to continue it, or choose another --out".into(),
            });
        }
        let existing = read_text_capped(&info_path, TEXT_FILE_LIMIT).map_err(FaultError::io(&info_path))?;
        if existing != info_text {
            return Err(FaultError::Output {
                path: info_path,
                why: "records a different campaign (spec, machine, code or golden run differ); choose another --out"
                    .into(),
            });
        }
        let existing_shard = read_shard(out)?;
        if existing_shard != opts.shard {
            let was = if existing_shard == Shard::ALL {
                "the whole campaign".to_string()
            } else {
                format!("shard {}/{}", existing_shard.index, existing_shard.count)
            };
            return Err(FaultError::Output { path: out.into(), why: format!("was run as {was}; resume it as that") });
        }
    } else {
        if records_path.exists() {
            return Err(FaultError::Output {
                path: records_path,
                why: "exists without campaign.json; choose another --out".into(),
            });
        }
        if let Some(t) = &shard_text {
            write_atomic(&shard_path, t)?;
        }
        write_atomic(&info_path, &info_text)?;
    }
    let scan = scan_records(&records_path, opts.shard.trials(info.trials), id)?;
    let (kept, keep_len) = (scan.in_order as usize, scan.in_order_end);
    let f = OpenOptions::new().create(true).append(true).open(&records_path).map_err(FaultError::io(&records_path))?;
    f.set_len(keep_len).map_err(FaultError::io(&records_path))?;
    // Timing lines of trials not kept go, and so do corrupt ones; the rest stay, once each.
    let timing_path = out.join("timing.jsonl");
    let recorded = |t: u64| {
        t < info.trials
            && t % opts.shard.count == opts.shard.index
            && ((t - opts.shard.index) / opts.shard.count) < kept as u64
    };
    let mut seen = vec![false; kept];
    let mut timing = open_lines(&timing_path)?;
    write_streamed(&timing_path, |w| {
        let Some(lines) = timing.as_mut() else { return Ok(()) };
        // A line too long or not UTF-8 ends what is kept: the file holds only wall times.
        while let Ok(Some(l)) = lines.next_line() {
            let Some(t) = timing_trial(l.text).filter(|&t| l.complete && recorded(t)) else { continue };
            let i = ((t - opts.shard.index) / opts.shard.count) as usize;
            if !std::mem::replace(&mut seen[i], true) {
                writeln!(w, "{}", l.text).map_err(FaultError::io(&timing_path))?;
            }
        }
        Ok(())
    })?;
    Ok((lock, kept))
}

/// The slice `dir` was run as: `shard.json`, or the whole campaign when there is none.
fn read_shard(dir: &Path) -> Result<Shard> {
    let path = dir.join("shard.json");
    match read_text_capped(&path, TEXT_FILE_LIMIT) {
        Ok(t) => {
            let s: Shard = serde_json::from_str(&t).map_err(|e| FaultError::Output {
                path: path.clone(),
                why: format!("not a shard file ({{\"index\": I, \"count\": N}}): {e}"),
            })?;
            if s.count == 0 || s.index >= s.count {
                return Err(FaultError::Output {
                    path,
                    why: format!("shard {}/{} is not a slice: 0 <= index < count", s.index, s.count),
                });
            }
            Ok(s)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Shard::ALL),
        Err(e) => Err(FaultError::io(&path)(e)),
    }
}

/// A record line as the summary reads it, with the campaign that wrote it.
#[derive(Deserialize)]
struct KeyLine<'a> {
    #[serde(borrow)]
    campaign: std::borrow::Cow<'a, str>,
    trial: u64,
    class: String,
    bit: u32,
    skipped: bool,
    verified_dead: bool,
    outcome: Outcome,
}

/// The records of a campaign directory as the summary reads them, streamed, each checked to
/// be of campaign `id`; a cut last line ends them (a run in progress or killed).
struct Keys {
    path: PathBuf,
    lines: Option<JsonLines>,
    id: String,
}

impl Keys {
    /// The records of `dir`, of campaign `id`.
    fn open(dir: &Path, id: &str) -> Result<Keys> {
        let path = dir.join("records.jsonl");
        Ok(Keys { lines: open_lines(&path)?, path, id: id.to_string() })
    }

    /// The next record, `None` at the end.
    fn next_key(&mut self) -> Result<Option<RecordKey>> {
        let Some(lines) = self.lines.as_mut() else { return Ok(None) };
        let Some(l) = lines.next_line().map_err(FaultError::io(&self.path))?.filter(|l| l.complete) else {
            return Ok(None);
        };
        let k: KeyLine = serde_json::from_str(l.text).map_err(|e| FaultError::Output {
            path: self.path.clone(),
            why: format!("line {}: not a trial record: {e}", l.number),
        })?;
        check_identity(&self.path, l.number, &k.campaign, &self.id)?;
        Ok(Some(RecordKey {
            trial: k.trial,
            class: k.class,
            bit: k.bit,
            skipped: k.skipped,
            verified_dead: k.verified_dead,
            outcome: k.outcome,
        }))
    }

    /// The records as an iterator that stops at the first error, left in `err`.
    fn iter<'a>(&'a mut self, err: &'a mut Option<FaultError>) -> impl Iterator<Item = RecordKey> + 'a {
        std::iter::from_fn(move || match self.next_key() {
            Ok(k) => k,
            Err(e) => {
                *err = Some(e);
                None
            }
        })
    }
}

/// The outcome of every recorded trial of the campaign directory `dir`, in file order
/// (records of another campaign refused).
pub fn outcomes(dir: &Path) -> Result<Vec<Outcome>> {
    let f = read_info(dir)?;
    let (mut keys, mut err) = (Keys::open(dir, &f.id)?, None);
    let out = keys.iter(&mut err).map(|k| k.outcome).collect();
    err.map_or(Ok(out), Err)
}

/// The outcomes of `dir`, the merge (or unsharded run) of an adaptive campaign's earlier
/// rounds, in trial order: its `campaign.json` must be `info_text` (the campaign being run),
/// and its records trials 0, 1, 2, ... in order.
pub fn merged_outcomes(dir: &Path, info_text: &str) -> Result<Vec<Outcome>> {
    let f = read_info(dir)?;
    if f.text != info_text {
        return Err(FaultError::Output {
            path: dir.join("campaign.json"),
            why: "records another campaign than the one being run (spec, machine, code or golden run differ): \
                  --after takes the merge of this campaign's shards"
                .into(),
        });
    }
    let shard = read_shard(dir)?;
    if shard != Shard::ALL {
        return Err(FaultError::Output {
            path: dir.join("shard.json"),
            why: format!(
                "says shard {}/{}, not a merge: --after takes the `faultline merge` of the shards",
                shard.index, shard.count
            ),
        });
    }
    let (mut keys, mut err, mut out) = (Keys::open(dir, &f.id)?, None, Vec::new());
    for k in keys.iter(&mut err) {
        if k.trial != out.len() as u64 {
            return Err(FaultError::Output {
                path: dir.join("records.jsonl"),
                why: format!(
                    "line {}: trial {} where trial {} belongs: not a whole campaign's records in order",
                    out.len() + 1,
                    k.trial,
                    out.len()
                ),
            });
        }
        out.push(k.outcome);
    }
    err.map_or(Ok(out), Err)
}

/// Checks that the first `count` records of the directory `dir` of slice `shard` are, byte for
/// byte, its trials' records in the merged directory `merged`: that `merged` was merged from it.
pub fn check_slice(dir: &Path, merged: &Path, shard: Shard, count: u64) -> Result<()> {
    let (path, merged_path) = (dir.join("records.jsonl"), merged.join("records.jsonl"));
    let (mut mine, mut theirs) = (open_lines(&path)?, open_lines(&merged_path)?);
    let short = |p: &Path| FaultError::Output { path: p.into(), why: "changed while being read".into() };
    let mut t = 0;
    for i in 0..count {
        let want = shard.index + i * shard.count;
        let m = theirs.as_mut().ok_or_else(|| short(&merged_path))?;
        let other = loop {
            let l = m.next_line().map_err(FaultError::io(&merged_path))?.ok_or_else(|| short(&merged_path))?;
            t += 1;
            if t > want {
                break l.text.to_string();
            }
        };
        let r = mine.as_mut().ok_or_else(|| short(&path))?;
        let l = r.next_line().map_err(FaultError::io(&path))?.ok_or_else(|| short(&path))?;
        if l.text != other {
            return Err(FaultError::Output {
                path: path.clone(),
                why: format!(
                    "line {}: trial {want} differs from its record in {}: not the directory merged there",
                    i + 1,
                    merged_path.display()
                ),
            });
        }
    }
    Ok(())
}

/// Writes `summary.json` of the records in `out` (streamed: memory does not grow with the
/// records) and returns it.
pub(crate) fn finish(out: &Path) -> Result<Summary> {
    let f = read_info(out)?;
    let (mut keys, mut err) = (Keys::open(out, &f.id)?, None);
    let summary = summarize(&f.info, keys.iter(&mut err));
    if let Some(e) = err {
        return Err(e);
    }
    write_atomic(&out.join("summary.json"), &json_text(&summary))?;
    Ok(summary)
}

/// Combines the complete shard directories `shards` (one per slice `i/N`, any order) into
/// `out`: the same `campaign.json`, `records.jsonl` and `summary.json` bytes one unsharded run
/// writes (and the shards' `timing.jsonl`, in trial order). Streamed: every shard is read
/// twice (checked, then copied), one line at a time.
pub fn merge(out: &Path, shards: &[PathBuf]) -> Result<Summary> {
    Ok(merge_rounds(out, shards)?.0)
}

/// [`merge`], which for an adaptive campaign takes shards holding their slices of the same
/// whole rounds (those run so far) and writes what an unsharded run stopped there writes;
/// returns the summary and, for an adaptive campaign, its next round or that it is finished.
pub fn merge_rounds(out: &Path, shards: &[PathBuf]) -> Result<(Summary, Option<Next>)> {
    let mut parts: std::collections::BTreeMap<u64, PathBuf> = std::collections::BTreeMap::new();
    let mut first: Option<(InfoFile, u64)> = None;
    // Each shard and the records it holds, complete and in order.
    let mut held: Vec<(PathBuf, Shard, u64)> = Vec::new();
    for dir in shards {
        let f = read_info(dir)?;
        let shard = read_shard(dir)?;
        match &first {
            None => first = Some((f.clone(), shard.count)),
            Some((g, n)) => {
                if g.text != f.text {
                    return Err(FaultError::Output {
                        path: dir.join("campaign.json"),
                        why: format!("differs from {}'s: the shards are of different campaigns", shards[0].display()),
                    });
                }
                if *n != shard.count {
                    return Err(FaultError::Output {
                        path: dir.join("shard.json"),
                        why: format!("is a slice of {} shards, {} of {n}", shard.count, shards[0].display()),
                    });
                }
            }
        }
        let path = dir.join("records.jsonl");
        let scan = scan_records(&path, shard.trials(f.info.trials), &f.id)?;
        if scan.in_order != scan.lines {
            return Err(FaultError::Output {
                path: dir.clone(),
                why: format!(
                    "shard {}/{} is incomplete or out of order ({} of its records in order, {} lines); run it with \
                     --resume first",
                    shard.index, shard.count, scan.in_order, scan.lines
                ),
            });
        }
        held.push((dir.clone(), shard, scan.lines));
        if parts.insert(shard.index, dir.clone()).is_some() {
            return Err(FaultError::Output { path: dir.clone(), why: format!("shard {} is given twice", shard.index) });
        }
    }
    let Some((f, count)) = first else {
        return Err(FaultError::Output { path: out.into(), why: "no shard directories to merge".into() });
    };
    let missing: Vec<String> = (0..count).filter(|i| !parts.contains_key(i)).map(|i| format!("{i}/{count}")).collect();
    if !missing.is_empty() {
        return Err(FaultError::Output { path: out.into(), why: format!("shards missing: {}", missing.join(", ")) });
    }
    // An adaptive campaign's shards hold the rounds run so far: the slices of trials 0..T
    // partition them, so T is the sum.
    let mut rounds = Rounds::of(&f.info);
    let trials = match rounds {
        Some(_) => held.iter().map(|h| h.2).sum(),
        None => f.info.trials,
    };
    for (dir, shard, got) in &held {
        let want = shard.trials(trials).count() as u64;
        if *got != want {
            let why = match rounds {
                Some(_) => format!(
                    "shard {}/{} holds {got} trials, but the shards hold {trials} in all, of which its slice is \
                     {want}: the shards stop at different rounds; run each one's slice of the same rounds (--resume, \
                     and the same --after)",
                    shard.index, shard.count
                ),
                None => format!(
                    "shard {}/{} is incomplete or out of order ({got} of its {want} trials recorded); run it with \
                     --resume first",
                    shard.index, shard.count
                ),
            };
            return Err(FaultError::Output { path: dir.clone(), why });
        }
    }
    let next = match rounds.as_mut() {
        Some(r) => {
            let outcomes = interleaved_outcomes(&parts, count, trials, &f.id)?;
            let next = r.advance(&outcomes);
            if next.start() != trials {
                return Err(FaultError::Output {
                    path: parts[&0].clone(),
                    why: format!(
                        "the shards hold trials 0..{trials}, which end inside {next}: run every shard's slice of \
                         that round to its end (--resume) first"
                    ),
                });
            }
            Some(next)
        }
        None => None,
    };
    let _lock = DirLock::acquire(out).map_err(FaultError::io(out))?;
    if out.join("records.jsonl").exists() || out.join("campaign.json").exists() {
        return Err(FaultError::Output {
            path: out.into(),
            why: "holds records already; choose an empty --out".into(),
        });
    }
    let open = |name: &str| -> Result<Vec<(PathBuf, JsonLines)>> {
        parts
            .values()
            .map(|d| {
                let p = d.join(name);
                let l = JsonLines::open_if_exists(&p).map_err(FaultError::io(&p))?;
                Ok(l.map(|l| (p, l)))
            })
            .filter_map(Result::transpose)
            .collect()
    };
    write_atomic(&out.join("campaign.json"), &f.text)?;
    // Trial t is line t / N of shard t % N (checked complete and in order above).
    let mut readers = open("records.jsonl")?;
    let records_path = out.join("records.jsonl");
    write_streamed(&records_path, |w| {
        for t in 0..trials {
            let (p, r) = &mut readers[(t % count) as usize];
            let l = r
                .next_line()
                .map_err(FaultError::io(p.as_path()))?
                .ok_or_else(|| FaultError::Output { path: p.clone(), why: "changed while being merged".into() })?;
            writeln!(w, "{}", l.text).map_err(FaultError::io(&records_path))?;
        }
        Ok(())
    })?;
    // Each shard's timing lines are in trial order: merge them by trial (corrupt lines dropped).
    let mut timing = open("timing.jsonl")?;
    let next_timing = |r: &mut JsonLines| -> Option<(u64, String)> {
        while let Ok(Some(l)) = r.next_line() {
            if let Some(t) = timing_trial(l.text).filter(|_| l.complete) {
                return Some((t, l.text.to_string()));
            }
        }
        None
    };
    let mut heads: Vec<Option<(u64, String)>> = timing.iter_mut().map(|(_, r)| next_timing(r)).collect();
    let timing_path = out.join("timing.jsonl");
    write_streamed(&timing_path, |w| {
        while let Some(i) =
            (0..heads.len()).filter(|&i| heads[i].is_some()).min_by_key(|&i| heads[i].as_ref().map(|h| h.0))
        {
            let (_, line) = heads[i].take().expect("a head");
            writeln!(w, "{line}").map_err(FaultError::io(&timing_path))?;
            heads[i] = next_timing(&mut timing[i].1);
        }
        Ok(())
    })?;
    Ok((finish(out)?, next))
}

/// The outcomes of trials `0..trials` held by the shard directories `parts` (slice `i` of
/// `count` at key `i`), in trial order.
fn interleaved_outcomes(
    parts: &std::collections::BTreeMap<u64, PathBuf>,
    count: u64,
    trials: u64,
    id: &str,
) -> Result<Vec<Outcome>> {
    let mut keys: Vec<Keys> = parts.values().map(|d| Keys::open(d, id)).collect::<Result<_>>()?;
    let mut out = Vec::with_capacity(trials as usize);
    for t in 0..trials {
        let k = &mut keys[(t % count) as usize];
        match k.next_key()? {
            Some(r) if r.trial == t => out.push(r.outcome),
            _ => return Err(FaultError::Output { path: k.path.clone(), why: "changed while being merged".into() }),
        }
    }
    Ok(out)
}
