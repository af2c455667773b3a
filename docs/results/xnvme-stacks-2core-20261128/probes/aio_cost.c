/* io_setup + io_destroy per iteration, as xNVMe's libaio queue does per file. */
#include <libaio.h>
#include <stdio.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(void){
  int n=50; double t0=now(), ts=0, td=0;
  for(int i=0;i<n;i++){io_context_t c=0; double a=now(); if(io_setup(2,&c)){perror("io_setup");return 1;} double b=now(); io_destroy(c); double d=now(); ts+=b-a; td+=d-b;}
  printf("io_setup %.1f us, io_destroy %.1f ms per queue (%d queues, %.1f queues/s)\n", ts/n*1e6, td/n*1e3, n, n/(now()-t0));
  return 0;}
