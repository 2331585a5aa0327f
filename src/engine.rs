//! `Model`: a packed model directory opened on a device — the dense
//! weights made resident, the expert files opened for streaming.

use crate::backend::cpu::CpuBackend;
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::experts::{ExpertStore, IoMode};
use crate::format::packed::WeightsFile;
use crate::model::{Net, State};
use std::path::Path;

/// Which device computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// CUDA when a GPU is present, CPU otherwise.
    #[default]
    Auto,
    Cpu,
}

impl std::str::FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Device> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            other => Err(Error::Invalid(format!(
                "unknown device `{other}` (expected auto or cpu)"
            ))),
        }
    }
}

/// How to open a model.
#[derive(Debug, Clone)]
pub struct Options {
    pub device: Device,
    pub io_mode: IoMode,
    /// Threads of the expert I/O pool.
    pub io_threads: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            device: Device::Auto,
            io_mode: IoMode::default(),
            io_threads: 8,
        }
    }
}

/// The backend-specific network (a closed set of backends).
pub(crate) enum Engine {
    Cpu(Net<CpuBackend>),
}

/// The backend-specific per-sequence state.
pub(crate) enum EngineState {
    Cpu(State<CpuBackend>),
}

/// A loaded model. Sessions borrow it; several may share one.
pub struct Model {
    pub(crate) engine: Engine,
    pub(crate) store: ExpertStore,
    config: ModelConfig,
    name: String,
}

impl Model {
    pub fn open(dir: &Path, opts: &Options) -> Result<Model> {
        let config = ModelConfig::from_dir(dir)?;
        let wf = WeightsFile::open(dir)?;
        let store = ExpertStore::open(dir, config.num_hidden_layers, opts.io_mode, opts.io_threads)?;
        for (i, l) in config.layers.iter().enumerate() {
            if l.ffn == crate::config::FfnKind::Moe {
                store.layer_layout(i)?.validate(
                    i,
                    config.hidden_size,
                    config.moe_intermediate_size,
                    store.group_size(),
                )?;
            }
        }
        let engine = match opts.device {
            Device::Auto | Device::Cpu => Engine::Cpu(Net::load(CpuBackend::new(), &config, &wf)?),
        };
        Ok(Model {
            engine,
            store,
            name: wf.manifest.model.clone(),
            config,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    pub fn n_vocab(&self) -> usize {
        self.config.vocab_size
    }
    pub fn n_ctx(&self) -> usize {
        self.config.max_position_embeddings
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn device_name(&self) -> &'static str {
        match &self.engine {
            Engine::Cpu(_) => "cpu",
        }
    }
    pub fn expert_store(&self) -> &ExpertStore {
        &self.store
    }

    pub(crate) fn new_state(&self, capacity: usize) -> Result<EngineState> {
        Ok(match &self.engine {
            Engine::Cpu(n) => EngineState::Cpu(n.new_state(capacity)?),
        })
    }

    fn timer(&self) -> &crate::model::timing::PhaseTimer {
        match &self.engine {
            Engine::Cpu(n) => &n.timer,
        }
    }

    /// Turn the per-phase timing of `--timing` on or off (it synchronizes
    /// the device at phase boundaries, so it costs a little when on).
    pub fn set_timing(&self, on: bool) {
        self.timer().set_enabled(on);
    }

    /// Seconds spent per phase since the model was opened (or `reset_timing`).
    pub fn phase_times(&self) -> crate::model::timing::PhaseTimes {
        self.timer().snapshot()
    }

    pub fn reset_timing(&self) {
        self.timer().reset();
    }

    pub(crate) fn has_recurrent_layers(&self) -> bool {
        match &self.engine {
            Engine::Cpu(n) => n.has_recurrent_layers(),
        }
    }

    pub(crate) fn state_size(&self, len: usize) -> usize {
        match &self.engine {
            Engine::Cpu(n) => n.state_size(len),
        }
    }

    pub(crate) fn save_state(&self, st: &EngineState, len: usize, out: &mut Vec<u8>) -> Result<()> {
        match (&self.engine, st) {
            (Engine::Cpu(n), EngineState::Cpu(s)) => n.save_state(s, len, out),
        }
    }

    pub(crate) fn load_state(&self, buf: &[u8], max_len: usize) -> Result<(EngineState, usize)> {
        match &self.engine {
            Engine::Cpu(n) => n.load_state(buf, max_len).map(|(s, l)| (EngineState::Cpu(s), l)),
        }
    }

    pub(crate) fn forward(&self, st: &mut EngineState, tokens: &[u32], pos0: usize, all: bool) -> Result<Vec<f32>> {
        match (&self.engine, st) {
            (Engine::Cpu(n), EngineState::Cpu(s)) => n.forward(s, &self.store, tokens, pos0, all),
        }
    }
}
