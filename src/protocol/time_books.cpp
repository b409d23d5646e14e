// The one-job runtime's gather of every rank's time book at the syncer (time_books.hpp). It lives
// here, not beside TimeBook in src/goodput, because the goodput books need no MPI.
#include "ddiloco/goodput.hpp"
#include "ddiloco/mpi.hpp"
#include "ddiloco/time_books.hpp"

namespace ddiloco::protocol {

std::vector<TimeBook> gather_time_books(const TimeBook& mine, MPI_Comm comm) {
  const std::vector<double> send = mine.to_vector();
  const int root = 0, n = mpi::size(comm);
  std::vector<double> all(mpi::rank(comm) == root ? static_cast<size_t>(n) * TimeBook::kFields : 0);
  MPI_Request request;
  mpi::check(MPI_Igather(send.data(), TimeBook::kFields, MPI_DOUBLE, all.data(), TimeBook::kFields,
                         MPI_DOUBLE, root, comm, &request),
             "Igather(time books)");
  mpi::wait(request);
  std::vector<TimeBook> books;
  for (size_t i = 0; i < all.size(); i += TimeBook::kFields)
    books.push_back(TimeBook::from_vector(all.data() + i));
  return books;
}

}  // namespace ddiloco::protocol
