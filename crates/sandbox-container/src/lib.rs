#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod engine;

pub use engine::{
    ArchiveBody, ContainerEngine, ContainerInfo, ContainerSpec, EngineError, EngineErrorKind,
    EngineResult, ExecInput, ExecRequest, ExecState, ExecStream, NetworkMode, PathStat,
};
