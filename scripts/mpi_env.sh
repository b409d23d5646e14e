# Sourced by the scripts that launch MPI jobs: settings for Debian's Open MPI 4.1 on one node.
# - root may run mpirun (containers, CI) only with these two variables;
# - UCX stays off (ob1 + shared memory/TCP), as measured in ../shared/design/platform_notes.md;
# - threads per rank default to cores / ranks (run.threads: 0), so ranks do not oversubscribe.
if [[ $(id -u) == 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader,tcp}
# mpirun with the flags every local launch here needs: more ranks than cores, no pinning (a
# rank's OpenMP threads share its cores), and -q so that an error the job reports itself is not
# buried under mpirun's banners.
DDILOCO_MPIRUN=(mpirun -q --oversubscribe --bind-to none)
ddiloco_mpirun() { "${DDILOCO_MPIRUN[@]}" "$@"; }
