//! Packet I/O for the L4 plane: AF_XDP sockets fed by an XDP steering
//! program (AF_PACKET when AF_XDP cannot be had), next-hop resolution
//! from the host's routes and neighbours, and the worker and control
//! threads that run [`gatehouse_l4::plane`] on real interfaces.
//!
//! - [`runtime`]: starts and stops the plane on its interfaces;
//! - [`shared`]: what its threads share (ports, counters, config);
//! - `control`: planes built and published, XDP maps, announcements,
//!   the control thread;
//! - `lane`: a worker thread's loop; `frame_io`: its frames in and out,
//!   over AF_XDP or AF_PACKET behind one interface;
//! - [`steer`], [`packet_socket`]: the XDP program and the AF_PACKET
//!   socket (AF_XDP sockets and next hops are `gatehouse_link`'s);
//! - [`ha`]: session sync and announcements for active/standby;
//! - [`takeover`]: the sessions handed to a process taking over;
//! - [`service`]: the plane as a service of the node.
//!
//! `unsafe` is confined to [`packet_socket`] (AF_PACKET system calls).

mod control;
mod frame_io;
pub mod ha;
mod lane;
pub mod packet_socket;
pub mod runtime;
pub mod service;
pub mod shared;
pub mod steer;
pub mod takeover;

pub use runtime::{HaStart, L4Runtime};
pub use service::L4;
pub use shared::{HealthFn, WorkerStats};
