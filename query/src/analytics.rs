//! LLM analytics over the store: for now the context-leak scan ([`leaks`]).

pub mod leaks;
