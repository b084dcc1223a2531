// The `egeria` command line (train, eval, bench) as a function of a program's arguments.
// A user's program that registers its models (models::register_model) and then returns
// eg::run_cli(argc, argv) is an egeria CLI that trains them: `prog train --model mine ...`.
#pragma once

namespace eg {

// Parses and runs one command; prints errors naming the flag or file at fault. Returns
// the process's exit status (0 on success). Under an MPI launcher a failing rank ends
// the whole job (dist::abort_job).
int run_cli(int argc, char** argv);

}  // namespace eg
