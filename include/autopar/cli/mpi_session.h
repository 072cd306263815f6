// MPI for the commands that run under mpirun, initialised on first use and finalised at exit.
#pragma once

namespace autopar::cli {

// Initialises MPI once (thread level FUNNELED); throws std::runtime_error if it cannot.
// Finalisation happens at process exit, after every communicator of the command is gone.
void EnsureMpi();
int MpiWorldRank();
int MpiWorldSize();

}  // namespace autopar::cli
