// scatter: step 1 of DataParallel. Cuts the batch along `dim` with torch.chunk's rule
// and puts piece i on devices[i], as one autograd node whose backward gathers the
// pieces' gradients back onto the input's device.
#pragma once

#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::parallel {

// Pieces of ceil(rows / devices) rows (30 rows on 4 devices: 8, 8, 8, 6); fewer pieces
// than devices when there are fewer rows (2 rows on 4 devices: 2 pieces), so DataParallel
// then runs fewer replicas. Piece i is on devices[i]; the copies are ordered on each
// device's copy stream (transfer.h).
std::vector<Tensor> scatter(const Tensor& input, const std::vector<Device>& devices,
                            int64_t dim = 0);

}  // namespace mg::parallel
