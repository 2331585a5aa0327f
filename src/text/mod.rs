//! The text layer: tokenizer (`tokenizers` reading `tokenizer.json`), chat
//! templates (`minijinja` with the Python helpers Hugging Face templates
//! use), sampling, stop conditions and streaming detokenisation.
//!
//! A typical generation loop:
//! ```text
//! let tok = Tokenizer::from_dir(dir)?;
//! let template = ChatTemplate::from_dir(dir)?;            // Option
//! let prompt = template.render(&ChatRequest { messages, add_generation_prompt: true, .. })?;
//! let ids = tok.encode(&prompt, false)?;                 // the template holds BOS etc.
//! let params = SamplingParams::from_defaults(&GenerationDefaults::from_dir(dir)?);
//! let mut sampler = Sampler::new(params.clone(), vocab)?;
//! let mut stream = TextStream::new(&tok, &params);
//! loop { let id = sampler.sample(&mut logits, &generated); let step = stream.push(id)?; ... }
//! ```

mod detok;
mod files;
mod grammar;
mod pyjinja;
mod rng;
mod sampling;
mod stop;
mod template;
mod tokenizer;

pub use detok::Detokenizer;
pub use files::{GenerationDefaults, TokenizerConfig};
pub use grammar::{Constraint, GrammarCompiler};
pub use rng::Rng;
pub use sampling::{Sampler, SamplingParams};
pub use stop::{FinishReason, Step, StopMatcher, StopOutput, TextStream};
pub use template::{ChatRequest, ChatTemplate};
pub use tokenizer::{model_eos_ids, Tokenizer};
