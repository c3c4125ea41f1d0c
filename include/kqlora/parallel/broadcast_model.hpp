#pragma once
// Rank 0's model on every rank: the NF4 components byte for byte, the frozen dense tensors
// and the flat float parameters, tensor by tensor in place (so all ranks hold rank 0's exact
// bytes).

#include "kqlora/nn/model.hpp"
#include "kqlora/parallel/communicator.hpp"

namespace kqlora {

template <class ExecSpace>
void broadcast_model(Communicator& comm, Model<ExecSpace>& model);

}  // namespace kqlora
