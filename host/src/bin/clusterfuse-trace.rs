//! Launch-trace analysis from the command line: TKLQT summaries, the CPU-/GPU-bound sweep
//! (with SVG plots) and proximity-score fusion advice. Run without arguments for usage.

use clusterfuse_host::trace::{self, AdviceOptions, Summary, Sweep, Trace};
use std::path::Path;
use std::process::ExitCode;

const USAGE: &str = "usage:
  clusterfuse-trace summary <trace.jsonl>...
  clusterfuse-trace advise <trace.jsonl> [--threshold 0.9] [--max-len 8]
  clusterfuse-trace sweep <trace.jsonl>... [--svg <dir>]   (each trace with its batch size)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<String, String> {
    let Some((command, rest)) = args.split_first() else { return Err(format!("no command\n{USAGE}")) };
    match command.as_str() {
        "summary" => {
            let traces = load(&Args::parse(rest, &[])?.files)?;
            let rows: Vec<_> = traces.iter().map(|t| (t, Summary::of(t))).collect();
            Ok(trace::summary_table(&rows))
        }
        "advise" => {
            let args = Args::parse(rest, &["--threshold", "--max-len"])?;
            let [file] = args.files.as_slice() else { return Err(format!("`advise` takes one trace\n{USAGE}")) };
            let defaults = AdviceOptions::default();
            let options = AdviceOptions {
                threshold: args.value("--threshold")?.unwrap_or(defaults.threshold),
                max_len: args.value("--max-len")?.unwrap_or(defaults.max_len),
            };
            let trace = Trace::load(file).map_err(|e| e.to_string())?;
            let summary = trace::summary_table(&[(&trace, Summary::of(&trace))]);
            Ok(summary + "\n" + &trace::advice_table(&trace::advise(&trace, &options)))
        }
        "sweep" => {
            let args = Args::parse(rest, &["--svg"])?;
            let points = load(&args.files)?.into_iter().map(|t| match t.batch {
                Some(batch) => Ok((batch, Summary::of(&t))),
                None => Err(format!("trace `{}` has no batch size", t.label)),
            });
            let sweep = Sweep::new(points.collect::<Result<Vec<_>, _>>()?);
            let mut report = trace::sweep_table(&sweep);
            if let Some(dir) = args.value::<String>("--svg")? {
                std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create `{dir}`: {e}"))?;
                for (name, plot) in trace::sweep_plots(&sweep) {
                    let path = Path::new(&dir).join(name);
                    std::fs::write(&path, plot.to_svg()).map_err(|e| format!("cannot write `{}`: {e}", path.display()))?;
                    report += &format!("wrote {}\n", path.display());
                }
            }
            Ok(report)
        }
        other => Err(format!("unknown command `{other}`\n{USAGE}")),
    }
}

/// A command's trace files and `--option value` pairs.
struct Args<'a> {
    files: Vec<&'a str>,
    options: Vec<(&'a str, &'a str)>,
}

impl<'a> Args<'a> {
    /// Splits `args`, accepting only the `allowed` options and at least one file.
    fn parse(args: &'a [String], allowed: &[&str]) -> Result<Self, String> {
        let (mut files, mut options) = (Vec::new(), Vec::new());
        let mut args = args.iter().map(String::as_str);
        while let Some(arg) = args.next() {
            if !arg.starts_with("--") {
                files.push(arg);
            } else if !allowed.contains(&arg) {
                return Err(format!("unknown option `{arg}`\n{USAGE}"));
            } else {
                options.push((arg, args.next().ok_or(format!("`{arg}` needs a value"))?));
            }
        }
        if files.is_empty() {
            return Err(format!("no trace files\n{USAGE}"));
        }
        Ok(Self { files, options })
    }

    /// The last value given for `name`, parsed.
    fn value<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, String> {
        let Some(&(_, text)) = self.options.iter().rev().find(|(option, _)| *option == name) else { return Ok(None) };
        text.parse().map(Some).map_err(|_| format!("invalid value `{text}` for `{name}`"))
    }
}

fn load(files: &[&str]) -> Result<Vec<Trace>, String> {
    files.iter().map(|f| Trace::load(f).map_err(|e| e.to_string())).collect()
}
