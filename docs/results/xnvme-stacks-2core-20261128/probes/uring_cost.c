/* io_uring_queue_init + register_files + exit per iteration, as xNVMe's io_uring queue per file. */
#include <liburing.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  int n=2000, fd=open("/etc/hostname",O_RDONLY); double t0=now(); clock_t c0=clock();
  for(int i=0;i<n;i++){struct io_uring r; if(io_uring_queue_init(2,&r,0)){perror("init");return 1;} if(argc>1) io_uring_register_files(&r,&fd,1); io_uring_queue_exit(&r);}
  double dt=now()-t0;
  printf("%s: %.1f us wall, %.1f us cpu per ring (%.0f rings/s)\n", argc>1?"init+register_files+exit":"init+exit", dt/n*1e6, (double)(clock()-c0)/CLOCKS_PER_SEC/n*1e6, n/dt);
  return 0;}
