#ifndef DEMO_HASHER_H
#define DEMO_HASHER_H
namespace demo {
class Hasher {
public:
    unsigned mix(double seconds);
private:
    unsigned state_ = 1;
};
}  // namespace demo
#endif
