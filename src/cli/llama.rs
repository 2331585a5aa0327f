//! llama.cpp's flags, for those who type them: its single-dash long
//! flags rewritten to ours before clap reads them, its environment
//! variables (`LLAMA_ARG_*`) copied to ours (`MOEFLUX_ARG_*`), and the
//! flags whose meaning differs refused with what to use instead.

use std::ffi::OsString;

/// llama.cpp's single-dash long flags and the flag each becomes. clap
/// would read `-np 4` as `-n p`.
const SINGLE_DASH: [(&str, &str); 9] = [
    ("-hf", "--model"),
    ("-hfr", "--model"),
    ("-np", "--parallel"),
    ("-ngl", "--n-gpu-layers"),
    ("-ot", "--override-tensor"),
    ("-ncmoe", "--n-cpu-moe"),
    ("-cmoe", "--cpu-moe"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
];

/// The arguments with llama.cpp's single-dash long flags spelled as ours
/// (up to a `--`).
pub fn rewrite(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out = Vec::new();
    let mut rest = false;
    for a in args {
        if rest {
            out.push(a);
            continue;
        }
        rest = a == "--";
        let to = a
            .to_str()
            .and_then(|s| SINGLE_DASH.iter().find(|(from, _)| *from == s).map(|(_, to)| *to));
        out.push(to.map_or(a, OsString::from));
    }
    out
}

/// llama.cpp's environment variables for the server's flags → ours, read
/// by clap (`env`); one already set wins.
const ENV: [(&str, &str); 11] = [
    ("LLAMA_ARG_MODEL", "MOEFLUX_ARG_MODEL"),
    ("LLAMA_ARG_HF_REPO", "MOEFLUX_ARG_MODEL"),
    ("LLAMA_ARG_HOST", "MOEFLUX_ARG_HOST"),
    ("LLAMA_ARG_PORT", "MOEFLUX_ARG_PORT"),
    ("LLAMA_ARG_N_PARALLEL", "MOEFLUX_ARG_N_PARALLEL"),
    ("LLAMA_ARG_CTX_SIZE", "MOEFLUX_ARG_CTX_SIZE"),
    ("LLAMA_ARG_THREADS", "MOEFLUX_ARG_THREADS"),
    ("LLAMA_ARG_ALIAS", "MOEFLUX_ARG_ALIAS"),
    ("LLAMA_ARG_CHAT_TEMPLATE_FILE", "MOEFLUX_ARG_CHAT_TEMPLATE"),
    ("LLAMA_ARG_CHAT_TEMPLATE", "MOEFLUX_ARG_CHAT_TEMPLATE"),
    ("LLAMA_API_KEY", "MOEFLUX_API_KEY"),
];

/// Copy llama.cpp's variables to ours (at start, before any thread).
pub fn copy_env() {
    let ours_too = [("MOEFLUX_ARG_API_KEY", "MOEFLUX_API_KEY")];
    for (from, to) in ENV.iter().chain(ours_too.iter()) {
        if std::env::var_os(to).is_none() {
            if let Some(v) = std::env::var_os(from) {
                std::env::set_var(to, v);
            }
        }
    }
}

/// The value parser of a llama.cpp flag that means something else here.
fn refuse(what: &str, instead: &str) -> String {
    format!("moeflux {what}: {instead}")
}

pub fn gpu_layers(_: &str) -> Result<String, String> {
    Err(refuse(
        "places layers itself (dense weights on the device, routed experts streamed into a cache there)",
        "size that cache with --expert-cache SIZE|N% (and host memory with --ram-cache)",
    ))
}

pub fn override_tensor(_: &str) -> Result<String, String> {
    Err(refuse(
        "decides where tensors live",
        "give the device's expert memory with --expert-cache SIZE|N% and the host's with --ram-cache",
    ))
}

pub fn cpu_moe(_: &str) -> Result<String, String> {
    Err(refuse(
        "streams experts instead of pinning layers to the CPU",
        "use --expert-cache SIZE|N% (0% keeps only the working set on the GPU) and --hybrid cpu to compute misses on the CPU",
    ))
}

/// Built-in chat templates `--chat-template NAME` takes.
pub fn builtin_template(name: &str) -> Option<&'static str> {
    match name {
        "chatml" => Some(moeflux::synth::tokenizer::CHAT_TEMPLATE),
        _ => None,
    }
}

pub const BUILTIN_TEMPLATES: &str = "chatml";

#[cfg(test)]
mod tests {
    #[test]
    fn single_dash_flags_become_ours_before_a_double_dash() {
        let args = ["moeflux", "serve", "-hf", "a/b:Q4_K_M", "-np", "4", "-n", "--", "-np"];
        let out = super::rewrite(args.iter().map(|s| s.into()));
        assert_eq!(
            out,
            [
                "moeflux",
                "serve",
                "--model",
                "a/b:Q4_K_M",
                "--parallel",
                "4",
                "-n",
                "--",
                "-np"
            ]
        );
    }
}
