//! The corruption corpus and its differential runner (issue 24): base
//! images (`base`), targeted damage by kind and seed (`damage`), the
//! workload both mounts run (`workload`), e2fsck's output sorted into
//! problem kinds (`fsck`), and the run that compares a kernel loop mount
//! with a jext4 FUSE mount on the same damaged image (`runner`).
#![allow(dead_code)]

pub mod base;
pub mod damage;
pub mod fsck;
pub mod runner;
pub mod workload;
