//! `card-quota replay`: offline what-if over real objects and AdmissionReviews.

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use crate::admission::{apply, bad_review, review, rooms, usage_report, usage_table};
use crate::decide::review::ReviewOut;
use crate::decide::Config;
use crate::snapshot::load::{documents, load_with};

/// Output format of the final usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Errors that stop a replay (only unreadable inputs).
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Objects {
        path: String,
        source: crate::snapshot::load::LoadError,
    },
    #[error("writing output: {0}")]
    Write(#[from] std::io::Error),
}

/// Why one document of a request stream could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DocError {
    #[error("request stream is not valid JSON after document {after}: {source}")]
    Json {
        after: usize,
        source: serde_json::Error,
    },
    #[error("expected one AdmissionReview per document, got {0}")]
    NotOne(usize),
    #[error(transparent)]
    Yaml(#[from] crate::snapshot::load::LoadError),
}

/// Splits a request stream into documents: JSON (concatenated, one per line, or an
/// array) or YAML (`---`-separated). A document that does not parse stays an error
/// so that it gets its own denial.
pub fn request_docs(text: &str) -> Vec<Result<Value, DocError>> {
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Vec::new();
    }
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let mut out = Vec::new();
        let mut stream = serde_json::Deserializer::from_str(trimmed).into_iter::<Value>();
        for item in stream.by_ref() {
            match item {
                Ok(Value::Array(items)) => out.extend(items.into_iter().map(Ok)),
                Ok(v) => out.push(Ok(v)),
                Err(e) => {
                    out.push(Err(DocError::Json {
                        after: out.len(),
                        source: e,
                    }));
                    break;
                }
            }
        }
        return out;
    }
    let mut docs: Vec<String> = vec![String::new()];
    for line in text.lines() {
        if line.starts_with("---") {
            docs.push(String::new());
        } else if let Some(last) = docs.last_mut() {
            last.push_str(line);
            last.push('\n');
        }
    }
    docs.into_iter()
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .map(|d| match documents(&d) {
            Ok(mut v) if v.len() == 1 => Ok(v.remove(0)),
            Ok(v) => Err(DocError::NotOne(v.len())),
            Err(e) => Err(DocError::Yaml(e)),
        })
        .collect()
}

fn read(path: &Path) -> Result<String, ReplayError> {
    std::fs::read_to_string(path).map_err(|source| ReplayError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Runs a replay, writing one AdmissionReview per line and then the usage. With
/// `decode_patches`, a response's `patch` is written as the JSON patch itself instead of
/// its base64 (for reading: the API server takes base64 only).
pub fn run(
    objects: &Path,
    requests: &Path,
    output: Output,
    decode_patches: bool,
    cfg: &Config,
    cards: &crate::cards::CardResources,
    out: &mut impl Write,
) -> Result<(), ReplayError> {
    let (mut snap, skipped) =
        load_with(&read(objects)?, cards).map_err(|source| ReplayError::Objects {
            path: objects.display().to_string(),
            source,
        })?;
    for s in skipped {
        tracing::warn!("{}: {s}", objects.display());
    }
    let text = read(requests)?;
    for (i, doc) in request_docs(&text).into_iter().enumerate() {
        let now = jiff::Timestamp::now();
        let mut readable = None;
        let answer = match doc {
            Ok(v) => {
                let r = review(&v, &mut snap, cfg, now, true);
                if let (Some(req), Some(d)) = (&r.request, &r.decision) {
                    if decode_patches && d.allowed && !d.patch.is_empty() {
                        readable = serde_json::to_value(&d.patch).ok();
                    }
                    if let Err(e) = apply(&mut snap, req, d) {
                        tracing::warn!("request {}: {e}", i + 1);
                    }
                    // The answer carries its patch in base64, as the API server wants
                    // it; the log shows it readable.
                    if d.allowed && !d.patch.is_empty() {
                        if let Ok(p) = serde_json::to_string(&d.patch) {
                            tracing::info!("request {}: patch {p}", i + 1);
                        }
                    }
                    if let Some(ev) = &d.event {
                        tracing::info!(
                            "event {} on {} {}: {}",
                            ev.reason,
                            ev.regarding.kind,
                            ev.regarding.name,
                            ev.message
                        );
                    }
                }
                r.out
            }
            Err(e) => ReviewOut::new(bad_review(
                "",
                format!("request {} cannot be parsed: {e}", i + 1),
            )),
        };
        match readable {
            Some(patch) => {
                let mut v = serde_json::to_value(&answer).map_err(std::io::Error::from)?;
                if let Some(r) = v.get_mut("response").and_then(|r| r.as_object_mut()) {
                    r.insert("patch".into(), patch);
                }
                serde_json::to_writer(&mut *out, &v).map_err(std::io::Error::from)?;
            }
            None => serde_json::to_writer(&mut *out, &answer).map_err(std::io::Error::from)?,
        }
        writeln!(out)?;
    }
    let report = usage_report(&snap, jiff::Timestamp::now());
    match output {
        Output::Json => {
            serde_json::to_writer(&mut *out, &serde_json::json!({ "usage": report }))
                .map_err(std::io::Error::from)?;
            writeln!(out)?;
        }
        Output::Table => {
            let rooms = rooms(&snap, &report, jiff::Timestamp::now());
            write!(out, "{}", usage_table(&report, &rooms))?
        }
    }
    Ok(())
}
