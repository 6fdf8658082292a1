//! Per-kernel PTX directives. `#[kernel]` leaves one facts line per kernel in the module
//! (`// clusterfuse-kernel name=k maxntid=256 minnctapersm=2 reqnctapercluster=4,1,1`);
//! here each becomes directives between the entry's parameter list and its body.

/// One kernel's launch directives, as its facts line states them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KernelDirectives {
    pub name: String,
    pub maxntid: Option<u32>,
    pub minnctapersm: Option<u32>,
    pub reqnctapercluster: Option<[u32; 3]>,
}

impl KernelDirectives {
    /// Parses a facts line; `None` when the line is not one.
    pub fn parse(line: &str) -> Option<Result<Self, String>> {
        let rest = line.trim().strip_prefix("// clusterfuse-kernel ")?;
        let parse = || -> Result<Self, String> {
            let mut facts = KernelDirectives::default();
            for field in rest.split_whitespace() {
                let (key, value) = field.split_once('=').ok_or(format!("malformed field `{field}`"))?;
                let number = |v: &str| v.parse::<u32>().map_err(|e| format!("`{field}`: {e}"));
                match key {
                    "name" => facts.name = value.to_string(),
                    "maxntid" => facts.maxntid = Some(number(value)?),
                    "minnctapersm" => facts.minnctapersm = Some(number(value)?),
                    "reqnctapercluster" => {
                        let dims: Vec<u32> = value.split(',').map(number).collect::<Result<_, _>>()?;
                        let dims: [u32; 3] = dims.try_into().map_err(|_| format!("`{field}` needs three extents"))?;
                        facts.reqnctapercluster = Some(dims);
                    }
                    _ => return Err(format!("unknown field `{field}`")),
                }
            }
            if facts.name.is_empty() {
                return Err("facts line without a name".into());
            }
            Ok(facts)
        };
        Some(parse().map_err(|e| format!("bad clusterfuse facts line `{}`: {e}", line.trim())))
    }

    /// The PTX performance-tuning directives (PTX ISA §11.4).
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if let Some(n) = self.maxntid {
            lines.push(format!(".maxntid {n}, 1, 1"));
        }
        if let Some(n) = self.minnctapersm {
            lines.push(format!(".minnctapersm {n}"));
        }
        if let Some([x, y, z]) = self.reqnctapercluster {
            lines.push(format!(".reqnctapercluster {x}, {y}, {z}"));
            lines.push(".explicitcluster".to_string());
        }
        lines
    }
}

/// Inserts every kernel's directives into its `.entry`; an error names a kernel whose facts
/// line has no entry.
pub fn insert_directives(ptx: &str) -> Result<String, String> {
    let kernels: Vec<KernelDirectives> = ptx.lines().filter_map(KernelDirectives::parse).collect::<Result<_, _>>()?;
    let mut out = String::with_capacity(ptx.len() + 64 * kernels.len());
    let mut pending: Option<&KernelDirectives> = None;
    let mut found = vec![false; kernels.len()];
    for line in ptx.lines() {
        out.push_str(line);
        out.push('\n');
        let code = line.split("//").next().unwrap_or_default().trim();
        if let Some(name) = entry_name(code) {
            if let Some(i) = kernels.iter().position(|k| k.name == name) {
                found[i] = true;
                pending = Some(&kernels[i]);
            }
        }
        // The parameter list ends with a line holding `)` alone (or the `.entry` line itself
        // ends with `()` when there are no parameters).
        let closes = code == ")" || (entry_name(code).is_some() && code.ends_with("()"));
        if closes {
            if let Some(kernel) = pending.take() {
                for directive in kernel.lines() {
                    out.push_str(&directive);
                    out.push('\n');
                }
            }
        }
    }
    if let Some(i) = found.iter().position(|f| !f) {
        return Err(format!("kernel `{}` has facts but no `.entry` in the PTX", kernels[i].name));
    }
    Ok(out)
}

/// The names of `ptx`'s entry functions (its kernels), in order.
pub fn entry_names(ptx: &str) -> impl Iterator<Item = &str> {
    ptx.lines().filter_map(entry_name)
}

fn entry_name(line: &str) -> Option<&str> {
    let rest = line.trim_start().strip_prefix(".visible .entry ").or_else(|| line.trim_start().strip_prefix(".entry "))?;
    Some(rest.split(['(', ' ']).next().unwrap_or(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "\
// clusterfuse-kernel name=k maxntid=256 minnctapersm=2 reqnctapercluster=4,1,1
// clusterfuse-kernel name=empty
.visible .entry k(
\t.param .u64 k_param_0
)                                       // @k
{
\tret;
}
.visible .entry empty()                 // @empty
{
\tret;
}
";

    #[test]
    fn inserts_directives_after_the_parameter_list() {
        let out = insert_directives(PTX).unwrap();
        let expected = ")                                       // @k\n.maxntid 256, 1, 1\n.minnctapersm 2\n.reqnctapercluster 4, 1, 1\n.explicitcluster\n{";
        assert!(out.contains(expected), "{out}");
        assert!(out.contains(".visible .entry empty()                 // @empty\n{"), "{out}");
    }

    #[test]
    fn rejects_facts_without_an_entry() {
        let err = insert_directives("// clusterfuse-kernel name=ghost maxntid=32\n").unwrap_err();
        assert!(err.contains("`ghost`"), "{err}");
    }

    #[test]
    fn rejects_malformed_facts() {
        assert!(insert_directives("// clusterfuse-kernel name=k maxntid=lots\n").is_err());
        assert!(insert_directives("// clusterfuse-kernel name=k reqnctapercluster=2,2\n").is_err());
    }
}
