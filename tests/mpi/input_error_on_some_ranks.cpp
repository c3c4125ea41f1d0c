// An InputError (exit 2) raised on some ranks only, while the others wait in a collective
// of the training's communicator: app::run must end the whole job with exit 2 within its
// grace period, the failing rank's message printed, instead of leaving the others waiting
// for comm_timeout_s. Raised on every rank alike, the job ends cleanly with exit 2.
// usage: input_error_on_some_ranks one|all   (under mpiexec, 2 or more ranks)
#include <iostream>
#include <string>
#include <vector>

#include "app_main.hpp"
#include "kqlora/core/error.hpp"
#include "kqlora/parallel/communicator.hpp"
#include "kqlora/parallel/world.hpp"

int main(int argc, char** argv) {
  return kqlora::app::run(argc, argv, "input_error_on_some_ranks", "usage: one|all\n",
                          [](std::vector<std::string>& args) {
                            const bool all = !args.empty() && args[0] == "all";
                            auto comm = kqlora::make_mpi_communicator(true);
                            comm->set_timeout(600);  // far beyond the test's own timeout
                            KQLORA_INPUT_CHECK(!(all || kqlora::world_rank() == 1),
                                               "the file only rank 1 reads is damaged");
                            double x = 1;  // the others: a collective rank 1 never joins
                            comm->wait(comm->allreduce_sum(&x, 1));
                            return 0;
                          });
}
