#pragma once
// Preemption: SIGTERM or SIGUSR1 (Slurm's --signal) asks the run to stop at the next step
// boundary, write a checkpoint and exit with exit_code_preempted. The handler only sets a
// flag; the training loop reads it (and agrees on it over all ranks).

namespace kqlora {

/// The exit code of a run stopped by a preemption signal after writing its checkpoint
/// (EX_TEMPFAIL: "try again"; the requeue template restarts on it).
constexpr int exit_code_preempted = 75;

/// Installs the SIGTERM and SIGUSR1 handlers.
void install_stop_handlers();
/// True once a stop signal arrived (or request_stop was called).
bool stop_requested();
/// The signal's effect, for tests.
void request_stop();
void clear();

}  // namespace kqlora
